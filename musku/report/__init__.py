"""What people look at and share: the HTML report with the paper's figures
(:mod:`musku.report.html`) and streaming exports (:mod:`musku.report.export`), both written as
strict JSON (:mod:`musku.strict_json`, in the base layer: every CLI uses it). The dry run's
planner is :mod:`musku.sweep.plan`.

Nothing heavy is imported here: matplotlib and pyarrow load inside the functions that need them.
"""
