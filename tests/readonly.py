"""A real read-only mount for a test's subprocess, as Kubernetes or compose `:ro` give a worker.

Tests run as root, and root ignores permission bits, so `chmod` proves nothing. Instead the
subprocess runs in its own mount namespace (`unshare --mount`, private propagation, so nothing
leaks to the machine) where the folder is bind-mounted over itself read-only: every write
under it fails with EROFS, for root too, exactly as on a read-only volume.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

_SCRIPT = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'


def read_only_prefix(folder: Path) -> list[str]:
    """A command prefix: what follows it runs with `folder` mounted read-only."""
    return ["unshare", "--mount", "sh", "-c", _SCRIPT, "sh", str(folder)]


@functools.cache
def _mounts_work() -> str | None:
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run([*read_only_prefix(Path(folder)), "sh", "-c", f"touch {folder}/x"],
                               capture_output=True, text=True, timeout=30)
        if "Read-only file system" in probe.stderr:
            return None
        return (probe.stderr or probe.stdout or f"exit {probe.returncode}").strip()[:200]


def require_read_only_mounts() -> None:
    """Skips the test where this machine lets no process make a private read-only bind mount."""
    problem = _mounts_work()
    if problem is not None:
        pytest.skip(f"no private read-only bind mount here (unshare --mount): {problem}")


def run_read_only(folder: Path, command: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*read_only_prefix(folder), *command], capture_output=True, text=True, timeout=timeout)
