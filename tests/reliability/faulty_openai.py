"""The fake OpenAI-compatible server, with faults a real provider shows, chosen by markers in the
question (the model otherwise plays as in tests/worker/fake_openai.py: search, cite, answer).

  [delay]              every request for this question takes DELAY_S (a ~1 s-per-request model)
  [delay:S]            every request for this question takes S seconds
  [fault:KIND:ID:N]    the first N requests for ID fail with KIND (N = `all`: every request)

KINDs are the failures FAULTS lists: HTTP errors, malformed bodies, a request that hangs, a body
that never ends, tool calls with malformed arguments or to a tool that does not exist, and a 401
whose body echoes the caller's key (a provider quoting a secret back).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.worker.conversational_openai import ConversationalOpenAI
from tests.worker.fake_openai import FakeOpenAI, _call

DELAY_S = 1.0
HANG_S = 30.0
ENDLESS_S = 60.0
UNKNOWN_TOOL = "delete_all_documents"

HTTP_FAULTS = {
    "429": (429, {"retry-after": "1", "retry-after-ms": "300"}, "Rate limit reached", "rate_limit_exceeded"),
    "500": (500, {}, "The server had an error while processing your request", None),
    "503": (503, {}, "The server is temporarily unavailable", None),
    "504": (504, {}, "Gateway timeout: the upstream model did not answer in time", None),
    "400": (400, {}, "Invalid request: this model does not support tools", "invalid_request_error"),
}
FAULTS = (*HTTP_FAULTS, "malformed", "truncated", "hang", "endless", "badargs", "unknowntool", "echo401")
_FAULT = re.compile(r"\[fault:(\w+):(\w+):(\w+)\]")
_DELAY = re.compile(r"\[delay(?::([\d.]+))?\]")


class FaultyOpenAI(FakeOpenAI):
    def __init__(self) -> None:
        super().__init__()
        self.faults_served: list[tuple[str, str]] = []

    def served(self, kind: str) -> int:
        with self.lock:
            return sum(1 for k, _ in self.faults_served if k == kind)

    async def chat(self, request: Request) -> Response:  # type: ignore[override]
        body = await request.json()
        messages = body.get("messages", [])
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        question = users[0] if users and isinstance(users[0], str) else ""
        fault = None
        with self.lock:
            for kind, key, n in _FAULT.findall(question):
                counter = f"fault:{kind}:{key}"
                self.counts[counter] += 1
                if n == "all" or self.counts[counter] <= int(n):
                    fault = kind
                    self.faults_served.append((kind, key))
                    self.requests.append({"authorization": request.headers.get("authorization"),
                                          "question": question, "body": body, "fault": kind})
                    break
        if fault is not None:
            return await self._fault(fault, body, request)
        delay = _DELAY.search(question)
        if delay:
            await asyncio.sleep(float(delay.group(1) or DELAY_S))
        return await super().chat(request)

    async def _fault(self, kind: str, body: dict[str, Any], request: Request) -> Response:
        if kind in HTTP_FAULTS:
            status, headers, message, code = HTTP_FAULTS[kind]
            return JSONResponse({"error": {"message": message, "type": "fault", "code": code}},
                                status_code=status, headers=headers)
        if kind == "malformed":
            return Response(b'{"id": "chatcmpl-broken", "choices": [{"message": ', media_type="application/json")
        if kind == "truncated":
            return JSONResponse({"id": "chatcmpl-empty", "object": "chat.completion", "created": int(time.time()),
                                 "model": body.get("model", "fake")})
        if kind == "hang":
            await asyncio.sleep(HANG_S)
            return JSONResponse({"error": {"message": "too late"}}, status_code=504)
        if kind == "endless":
            return StreamingResponse(self._endless(request), media_type="application/json")
        if kind == "badargs":
            return JSONResponse(_call(body, "passages_search", '{"query": "unterminated', 0))
        if kind == "unknowntool":
            return JSONResponse(_call(body, UNKNOWN_TOOL, json.dumps({"confirm": True}), 0))
        if kind == "echo401":
            presented = request.headers.get("authorization", "")
            message = f"Incorrect API key provided: {presented.removeprefix('Bearer ')}"
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                           "code": "invalid_api_key"}}, status_code=401)
        raise AssertionError(f"unknown fault {kind!r}")

    @staticmethod
    async def _endless(request: Request) -> AsyncIterator[bytes]:
        """A 200 whose JSON body starts and never finishes (a stuck proxy or model server)."""
        yield b'{"id": "chatcmpl-endless", "object": "chat.completion", "choices": ['
        deadline = time.monotonic() + ENDLESS_S
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                return
            yield b" "
            await asyncio.sleep(0.5)


class SlowConversationalOpenAI(ConversationalOpenAI):
    """The turn-aware fake (every turn searches, cites, answers), at DELAY_S per request."""

    async def chat(self, request: Request) -> JSONResponse:  # type: ignore[override]
        await request.body()  # read (and cached) before the wait: a killed worker cannot send it later
        await asyncio.sleep(DELAY_S)
        return await super().chat(request)
