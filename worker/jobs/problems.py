"""How a pydantic validation error reads in the message a producer gets back, for every model a job
is made of (lines, configs, capability options).

pydantic's own messages ("Field required", "Input should be a valid integer") do not say where they
are, so they are prefixed with the path of the bad value. Our validators raise `refused(...)`: a
whole sentence naming the bad value and what is accepted, which says where it is itself by `{at}`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_core import ErrorDetails, PydanticCustomError

REFUSED = "refused"


def refused(message: str) -> PydanticCustomError:
    """Raise this from a validator. `{at}` in the message becomes the value's path (`turns[1]`)."""
    return PydanticCustomError(REFUSED, message)


def path(loc: Sequence[int | str], prefix: str = "") -> str:
    """`body.messages[0].content`, as a producer would point at the value in the JSON they sent."""
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def problem(error: ErrorDetails, *, prefix: str = "", whole: str = "") -> str:
    """One error as a sentence; `prefix` is where the validated value sits in the job, and `whole`
    names the value itself for an error about all of it (no path at all when empty)."""
    at = path(error["loc"], prefix) or whole
    if error["type"] == REFUSED:
        return error["msg"].replace("{at}", at)
    message = error["msg"].removeprefix("Value error, ")
    return f"{at}: {message}" if at else message
