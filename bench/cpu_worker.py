"""A real worker process whose model is CPU-bound and scripted: the scale-out benchmark's worker.

`python -m bench.cpu_worker worker ...` (Celery's own arguments) registers one extra model name,
`bench-cpu`, then starts the usual `worker.app` worker; `python -m bench.cpu_worker supervise N NAME
THREADS` runs N of those under the supervisor of `grounded worker --processes N`. The model makes the same three turns as the
in-process benchmarks (search with the question, cite the first results shown, answer), and before
each it does a fixed amount of pure-Python work, so throughput is in units of work that cannot
overlap inside one process (the GIL) and can only scale across processes. Everything else is the
production path: the task, the results store, the capabilities, the SQLite corpus.

Only this launcher knows the model; it wraps `worker.runtime.llms.build_model`, which `ModelCache`
looks up at call time, and leaves every other model name to the original.
"""

from __future__ import annotations

import sys
from typing import Any

CPU_MODEL = "bench-cpu"
WORK_UNITS = 800_000
"""Loop iterations before each model turn: about 40 ms of one core on the development machine."""


def burn(units: int = WORK_UNITS) -> int:
    x = 1
    for i in range(units):
        x = (x * 31 + i) % 1_000_003
    return x


def cpu_model() -> Any:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from bench.overhead_capabilities import search_cite_answer

    def turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        burn()
        return search_cite_answer(messages, info)

    return FunctionModel(turn, model_name=CPU_MODEL)


def install() -> None:
    import worker.runtime.llms as models

    original = models.build_model

    def build_model(config: Any, *, allowlist: Any = None) -> Any:
        if config.model == CPU_MODEL and config.endpoint is None:
            models.check_model_allowed(config, allowlist)
            return cpu_model()
        return original(config, allowlist=allowlist)

    models.build_model = build_model


def worker_argv(name: str, threads: int) -> list[str]:
    from worker.store.keys import QUEUE

    return ["worker", "--pool", "threads", "-c", str(threads), "-Q", QUEUE, "-n", name, "-l", "warning",
            "--without-gossip", "--without-mingle", "--without-heartbeat"]


def run_worker(argv: list[str]) -> int:
    install()
    from worker.app import app

    app.worker_main(argv)
    return 0


def supervise(processes: int, base: str, threads: int) -> int:
    """What `grounded worker --processes N` runs, with these workers as its children."""
    from worker.tasks.supervisor import Supervisor, child_names, preload

    preload()
    return Supervisor(child_names(base, processes), lambda name: run_worker(worker_argv(name, threads))).run()


def main(argv: list[str]) -> None:
    if argv[:1] == ["supervise"]:  # supervise PROCESSES BASE_NAME THREADS
        sys.exit(supervise(int(argv[1]), argv[2], int(argv[3])))
    sys.exit(run_worker(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
