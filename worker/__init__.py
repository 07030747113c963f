"""The job side: settings, jobs, the Celery worker, the results store, the producer API and the CLI.

It imports `capabilities`; nothing in `capabilities` imports it.
"""
