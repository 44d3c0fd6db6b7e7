"""What people look at and share: the HTML report with the paper's figures
(:mod:`musku.report.html`), streaming exports (:mod:`musku.report.export`) and strict JSON
(:mod:`musku.report.strict_json`). The dry run's planner is :mod:`musku.sweep.plan`.

Nothing heavy is imported here: matplotlib and pyarrow load inside the functions that need them.
"""
