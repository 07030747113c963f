"""Python client for the producer API."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx2

LONG_POLL_S = 20.0  # how long the API holds one `wait` request (at most MAX_WAIT_S)


class APIError(RuntimeError):
    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code, self.detail = status_code, detail


class BatchRejected(APIError):
    """422: `errors` lists {line, problem}; line 0 is the config. Nothing was enqueued."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.detail if isinstance(self.detail, list) else []


class NotFound(APIError):
    """404: no such batch, job or conversation for this token's tenant."""


class Conflict(APIError):
    """409: a follow-up's config differs from its conversation's composition (H3); nothing was queued."""


class GroundedClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, http: httpx2.Client | None = None) -> None:
        self.http = http or httpx2.Client(base_url=base_url.rstrip("/"), timeout=timeout)
        self.http.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> GroundedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, response: httpx2.Response) -> httpx2.Response:
        if response.status_code < 400:
            return response
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        kind = {422: BatchRejected, 404: NotFound, 409: Conflict}.get(response.status_code, APIError)
        raise kind(response.status_code, detail)

    def submit(self, lines: Iterable[Mapping[str, Any] | str], config: Mapping[str, Any] | str, *,
               arm: str | None = None) -> dict[str, Any]:
        body = {"config": config, "lines": list(lines), "arm": arm}
        return self._check(self.http.post("/v1/batches", json=body)).json()

    def submit_file(self, path: Path, config_text: str, *, arm: str | None = None) -> dict[str, Any]:
        data = {"config": config_text, **({"arm": arm} if arm else {})}
        with path.open("rb") as handle:
            files = {"file": (path.name, handle, "application/x-ndjson")}
            return self._check(self.http.post("/v1/batches", data=data, files=files)).json()

    def batches(self) -> list[dict[str, Any]]:
        return self._check(self.http.get("/v1/batches")).json()

    def status(self, batch_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """With `wait_s`, the API answers when the batch finishes or after that many seconds."""
        if not wait_s:
            return self._check(self.http.get(f"/v1/batches/{batch_id}")).json()
        timeout = self.http.timeout
        held = httpx2.Timeout(connect=timeout.connect, read=(timeout.read or 30.0) + wait_s, write=timeout.write,
                              pool=timeout.pool)
        return self._check(self.http.get(f"/v1/batches/{batch_id}", params={"wait_s": f"{wait_s:.3f}"},
                                         timeout=held)).json()

    def results(self, batch_id: str) -> Iterator[dict[str, Any]]:
        with self.http.stream("GET", f"/v1/batches/{batch_id}/results") as response:
            if response.status_code >= 400:
                response.read()
                self._check(response)
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def events(self, batch_id: str, *, after: str | None = None) -> list[dict[str, Any]]:
        params = {"after": after} if after else {}
        return self._check(self.http.get(f"/v1/batches/{batch_id}/events", params=params)).json()

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._check(self.http.post(f"/v1/batches/{batch_id}/cancel")).json()

    def delete(self, batch_id: str) -> dict[str, Any]:
        """The batch and everything under it, now (H16)."""
        return self._check(self.http.delete(f"/v1/batches/{batch_id}")).json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self._check(self.http.get(f"/v1/jobs/{job_id}")).json()

    def follow_up(self, conversation_id: str, question: str, *, config: Mapping[str, Any] | str | None = None,
                  custom_id: str | None = None, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One more user turn on a stored conversation; returns its job and batch ids."""
        body: dict[str, Any] = {"question": question}
        for key, value in (("config", config), ("custom_id", custom_id), ("metadata", metadata)):
            if value is not None:
                body[key] = value
        return self._check(self.http.post(f"/v1/conversations/{conversation_id}/turns", json=body)).json()

    def conversation(self, conversation_id: str, *, wire: bool = False) -> dict[str, Any]:
        params = {"wire": "true"} if wire else {}
        return self._check(self.http.get(f"/v1/conversations/{conversation_id}", params=params)).json()

    def wait(self, batch_id: str, *, timeout: float = 600.0) -> dict[str, Any]:
        """Until the batch is completed or cancelled; raises TimeoutError otherwise. Each request is
        held by the API until the batch finishes (or LONG_POLL_S passes), so the end is seen as it
        happens instead of at the next poll."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            status = self.status(batch_id, wait_s=max(0.001, min(LONG_POLL_S, remaining)))
            if status["state"] in ("completed", "cancelled"):
                return status
            if remaining <= 0:
                raise TimeoutError(f"batch {batch_id} is still {status['state']} after {timeout:g} s")
