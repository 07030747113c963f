"""The ready-made agent dependencies (L15): one state dict per conversation, carried whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Deps:
    """What a host passes as `deps`: the whole `state` dict goes back with every run (H11)."""

    state: dict[str, Any] = field(default_factory=dict)
    conversation_id: str | None = None


def host_state(deps: Any) -> dict[str, Any] | None:
    """The host's state dict, or None for hosts that carry none (L15, P12)."""
    state = getattr(deps, "state", None)
    return state if isinstance(state, dict) else None
