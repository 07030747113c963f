"""Evidence capabilities, citation policy and evidence compaction for pydantic-ai agents.

Nothing in this package knows about jobs, queues or Redis, so any host (the Celery worker, a
chat app, a notebook) can register the same capabilities.
"""
