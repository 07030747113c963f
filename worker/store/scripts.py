"""Lua scripts sent as EVAL, so that they can be queued on a pipeline (a MULTI/EXEC transaction
with other writes) at no extra cost.

redis-py's registered `Script`, queued on a pipeline, makes the pipeline ask Redis whether the
script is loaded (SCRIPT EXISTS) before every execute: one more round trip for each write that uses
it, and a job's result write is one of them. EVAL sends the script's text instead; Redis caches
the compiled script by its digest all the same, and after a restart that emptied its script cache
nothing needs loading again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def eval_script(client: Any, script: str, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
    """`script` with its keys and arguments in one EVAL: queued when `client` is a pipeline, run
    (and its reply returned) when it is a client."""
    return client.eval(script, len(keys), *keys, *args)
