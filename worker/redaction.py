"""What counts as a secret, and how it is kept out of what we store, serve and log.

Two leaks it closes: a provider may quote the key it was sent ("Incorrect API key provided:
sk-..."), and a job's error message is stored, served by the API and logged; and a careless log
call may pass a key, a token or a whole document as a field. One list of secret-looking names
serves both, so the log filter and the error scrubber cannot drift apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values (a tenant name, a flag) would redact ordinary words
# the last word of a name; `TOKENS` only as API_TOKENS, since `input_tokens` counts tokens, it holds none
_SECRET_NAME = re.compile(
    r"(^|_)(KEYS?|TOKEN|API_TOKENS|SECRETS?|PASSWORD|PASSWD|CREDENTIALS?|AUTHORIZATION|COOKIE|BEARER)$", re.I
)
_LIST_SEPARATORS = re.compile(r"[\s,;=\"'{}\[\]]+")


def is_secret_name(name: str) -> bool:
    """`OPENAI_API_KEY`, `GROUNDED_TAG_KEYS`, `api_tokens`, `authorization`, `bearer`, ..."""
    return bool(_SECRET_NAME.search(name))


def secret_values(environ: Mapping[str, str], extra_names: Iterable[str] = ()) -> set[str]:
    """The values of environment variables whose names say they hold a secret, split into their
    listed parts (GROUNDED_TAG_KEYS, GROUNDED_API_TOKENS), plus those of `extra_names` (a job
    endpoint's key variable, whatever its name)."""
    named = [value for name, value in environ.items() if is_secret_name(name)]
    named += [environ.get(name, "") for name in extra_names]
    values: set[str] = set()
    for value in named:
        values.add(value.strip())
        values.update(_LIST_SEPARATORS.split(value))
    return {v for v in values if len(v) >= MIN_SECRET_CHARS}


def scrub(text: str, extra_names: Iterable[str] = (), *, environ: Mapping[str, str] | None = None) -> str:
    """`text` with every secret this process holds replaced, longest first (a key inside a list)."""
    found = secret_values(os.environ if environ is None else environ, extra_names)
    for secret in sorted(found, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def url_without_password(url: str) -> str:
    """A connection URL fit to print: `redis://:secret@host/0` becomes `redis://:***@host/0`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
