"""Secrets out of error messages: a provider may quote the key it was sent ("Incorrect API key
provided: sk-..."), and a job's error message is stored, served by the API and logged.

The secrets are the worker's own: the values of environment variables whose names say they hold
one (…_KEY, …_KEYS, …_TOKEN(S), …_SECRET, …_PASSWORD: model keys, GROUNDED_TAG_KEYS,
GROUNDED_API_TOKENS), split into their listed parts, and the job endpoint's key, whatever its name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from .jobs import JobConfig

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values (a tenant name, a flag) would redact ordinary words
_SECRET_NAME = re.compile(r"(^|_)(KEY|KEYS|TOKEN|TOKENS|SECRET|SECRETS|PASSWORD|PASSWD|CREDENTIALS?)$", re.I)
_LIST_SEPARATORS = re.compile(r"[\s,;=\"'{}\[\]]+")


def secret_values(environ: Mapping[str, str], config: JobConfig | None = None) -> set[str]:
    values: set[str] = set()
    named = [value for name, value in environ.items() if _SECRET_NAME.search(name)]
    if config is not None and config.endpoint is not None and config.endpoint.api_key_env:
        named.append(environ.get(config.endpoint.api_key_env, ""))
    for value in named:
        values.add(value.strip())
        values.update(_LIST_SEPARATORS.split(value))
    return {v for v in values if len(v) >= MIN_SECRET_CHARS}


def scrub(text: str, config: JobConfig | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """`text` with every secret this worker holds replaced, longest first (a key inside a list)."""
    found: Iterable[str] = secret_values(os.environ if environ is None else environ, config)
    for secret in sorted(found, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
