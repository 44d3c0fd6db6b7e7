"""What people look at and share: the HTML report with the paper's figures
(:mod:`musku.report.html`), streaming exports (:mod:`musku.report.export`), the dry run
(:mod:`musku.report.dryrun`) and strict JSON (:mod:`musku.report.strict_json`).

Nothing heavy is imported here: matplotlib and pyarrow load inside the functions that need them.
"""
