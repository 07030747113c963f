"""Celery: the app's settings (`celery_app`), the task (`answer`), what a worker process lends its
jobs (`process`), Flower's view of a job (`events`), requeueing when Redis is down (`requeue`),
logging (`logs`), and starting a worker as a subprocess (`worker_process`).

Importing this package imports none of its modules, so a producer can build an app to send tasks
without loading the task code.
"""
