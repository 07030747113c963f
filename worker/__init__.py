"""The job side: everything about batches, jobs, queues and results. It imports `capabilities`;
nothing in `capabilities` imports it.

Layers, top to bottom (each imports only those below it; `lint-imports` checks this):
`cli` → `api` → `evaluation`, `interfaces` (MCP, OpenAI Batch, chat) → `producer`, `client` → `tasks` →
`runtime` → `store` → `jobs` → `settings`, `redaction`. `worker.app` is the worker's Celery app, for `celery -A worker.app`.
docs/design/architecture.md walks a job through these modules.
"""
