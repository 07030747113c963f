"""Job configs the operator serves by name (GROUNDED_CONFIGS), for callers that cannot send one.

An MCP tool call, an OpenAI Batch line and a terminal chat have no place for a job config, and
whatever they could say (an OpenAI `model` field, say) is the caller's choice. So they name a
config the operator registered, and the server reads it (I1): the caller never supplies the
agent, endpoint, corpora or budgets, and the model allowlist is checked on what the server chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from .models import JobConfig
from .problems import problem


class UnknownConfig(LookupError):
    """A name that is not a served config; the message names the ones that are."""

    def __init__(self, name: str | None, served: Mapping[str, Path]) -> None:
        listing = ", ".join(sorted(served)) or "none (set GROUNDED_CONFIGS=name=path)"
        if name is None:
            problem = "no config was named and this server has no default (GROUNDED_DEFAULT_CONFIG)"
        else:
            problem = f"config {name!r} is not served here"
        super().__init__(f"{problem}; served configs: {listing}")
        self.name = name


class BrokenConfig(RuntimeError):
    """A registered config file that cannot be read: the operator's mistake, so the API refuses to start."""


def config_name(served: Mapping[str, Path], name: str | None, default: str | None) -> str:
    """The name a request means: its own, else the default, else the only one served (I1)."""
    chosen = name if name is not None else default
    if chosen is None and len(served) == 1:
        chosen = next(iter(served))
    if chosen is None or chosen not in served:
        raise UnknownConfig(name, served)
    return chosen


def read_config(name: str, path: Path) -> JobConfig:
    """Read on every use, so an operator's edit takes effect without a restart."""
    try:
        return JobConfig.from_text(path.read_text())
    except OSError as exc:
        raise BrokenConfig(f"GROUNDED_CONFIGS {name!r}: cannot read {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        raise BrokenConfig(f"GROUNDED_CONFIGS {name!r} ({path}): {problem(exc.errors()[0])}") from None
    except ValueError as exc:
        raise BrokenConfig(f"GROUNDED_CONFIGS {name!r} ({path}): {exc}") from None
