"""Which models and endpoint keys a job may use on this deployment: checked at submission and
again on the worker, so a job the workers would refuse is never queued, and a worker never trusts
what a producer checked."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from .models import JobConfig


class ModelUnavailable(ValueError):
    """The job's model cannot be built on this worker: a permanent error, failed at once."""


def model_label(config: JobConfig) -> str:
    """The name results record, so every answer can be traced to the model that produced it."""
    if config.endpoint is not None:
        return f"openai-compatible:{config.model}"
    return config.model


def check_model_allowed(config: JobConfig, allowlist: Sequence[str] | None) -> None:
    if allowlist is None:
        return
    label = model_label(config)
    if not any(fnmatch.fnmatchcase(label, pattern) for pattern in allowlist):
        raise ModelUnavailable(f"model {label!r} is not allowed on this worker; allowed: {', '.join(allowlist)}")


def check_endpoint_key(config: JobConfig, bindings: Mapping[str, str]) -> None:
    """A job chooses its endpoint's base_url, so a key it names is read only when the worker's
    operator bound that variable to a matching URL (GROUNDED_ENDPOINT_KEY_BINDINGS); otherwise anyone
    holding an API token could have a worker send its provider keys to a server of their choosing."""
    endpoint = config.endpoint
    if endpoint is None or endpoint.api_key_env is None:
        return
    check_key_binding(endpoint.api_key_env, endpoint.base_url, bindings, field="endpoint.api_key_env")


def check_key_binding(name: str, base_url: str, bindings: Mapping[str, str], *, field: str) -> None:
    """The one rule for every key variable a worker sends to an OpenAI-compatible server, for
    models and embedders alike: only to URLs its binding allows."""
    pattern = bindings.get(name)
    if pattern is None:
        bound = ", ".join(sorted(bindings)) or "none"
        raise ModelUnavailable(
            f"{field} {name!r} is not bound to an endpoint on this worker (bound: {bound}); "
            "GROUNDED_ENDPOINT_KEY_BINDINGS says which key variable may be sent to which base_url"
        )
    if not fnmatch.fnmatchcase(base_url, pattern):
        raise ModelUnavailable(
            f"{field} {name!r} may be sent only to base URLs matching {pattern!r}, not {base_url!r}"
        )
