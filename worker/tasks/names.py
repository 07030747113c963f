"""The task name producers send and workers run; apart so that every module of `worker.tasks` can
name it without importing the app."""

ANSWER_JOB = "grounded.answer_job"
