"""The job language: configs, batches, jobs and results (`models`), validating lines into jobs
(`lines`), which capabilities and corpora a config may name (`composition`), and which models and
endpoint keys it may use (`allowlist`). Pure: no Redis, no Celery, no agent runs.
"""
