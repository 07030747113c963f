"""One job, without Celery: the agent a config builds (`agents`), the model it runs on (`llms`,
`extractive`), the run itself with its commits (`run`), conversation runs on a stored conversation
(`conversations`), what a turn becomes in a result (`turns`), and the process's event loop (`loop`).
"""
