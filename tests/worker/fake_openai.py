"""A fake OpenAI-compatible chat server on 127.0.0.1, so the real OpenAI client path is exercised.

It plays a model that searches with the question, cites the first chunk it was shown, and answers.
Markers in the question change its behaviour:
  [flaky:ID]    the first two requests for ID get 429 with a Retry-After
  [down:ID]     the first request for ID gets 503
  [uncited]     answers without citing, and cites only when the policy's redirect arrives
  [slow:ID]     the first request for ID takes SLOW_S seconds (time to kill a worker mid-job)

`/v1/embeddings` answers with tests/concepts.py's vectors (`dimensions` in the body, or
`embedding_dimensions` on the server, sets their length), so hybrid corpora can be built and
searched through the real OpenAI client.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import Counter
from typing import Any, Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.concepts import DIMENSIONS, concept_vector
from worker.store.embedded import free_port

FAKE_ANSWER = "Fake answer from the knowledge base."
SLOW_S = 4.0
_CHUNK_ID = re.compile(r"^\[([^\]]+)\] \[rank", re.MULTILINE)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _completion(body: dict[str, Any], message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _call(body: dict[str, Any], name: str, arguments: str, n: int) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{name}_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    return _completion(body, message, "tool_calls")


class LocalServer:
    """A FastAPI app served on a free 127.0.0.1 port from a thread, for the fake model servers."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.app = FastAPI()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{type(self).__name__} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


class FakeOpenAI(LocalServer):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.post("/v1/embeddings")(self.embeddings)
        self.embedding_dimensions = DIMENSIONS
        self.embedding_requests: list[dict[str, Any]] = []

    def requests_for(self, marker: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if marker in r["question"]]

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        messages = body.get("messages", [])
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        question = users[0] if users else ""
        with self.lock:
            self.requests.append({"authorization": request.headers.get("authorization"), "question": question,
                                  "body": body})
            for marker, failures in (("flaky", 2), ("down", 1)):
                for key in re.findall(rf"\[{marker}:(\w+)\]", question):
                    self.counts[f"{marker}:{key}"] += 1
                    if self.counts[f"{marker}:{key}"] <= failures:
                        return self._failure(marker)
            slow = [key for key in re.findall(r"\[slow:(\w+)\]", question) if not self.counts[f"slow:{key}"]]
            for key in slow:
                self.counts[f"slow:{key}"] += 1
        if slow:
            await asyncio.sleep(SLOW_S)
        tools = {t["function"]["name"] for t in body.get("tools", [])}
        called = [c["function"]["name"] for m in messages if m.get("role") == "assistant"
                  for c in m.get("tool_calls") or []]
        n = len(called)
        if "passages_search" in tools and "passages_search" not in called:
            query = re.sub(r"\[[^\]]*\]", "", question).strip()
            return JSONResponse(_call(body, "passages_search", json.dumps({"query": query}), n))
        shown = [c for m in messages if m.get("role") == "tool" for c in _CHUNK_ID.findall(_text(m.get("content")))]
        redirected = any("[cite-request" in u for u in users[1:])
        wants_cite = "[uncited]" not in question or redirected
        if "passages_cite" in tools and "passages_cite" not in called and wants_cite:
            chunk_ids = shown[:1]
            return JSONResponse(_call(body, "passages_cite", json.dumps({"chunk_ids": chunk_ids}), n))
        return JSONResponse(_completion(body, {"role": "assistant", "content": FAKE_ANSWER}, "stop"))

    async def embeddings(self, request: Request) -> JSONResponse:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        with self.lock:
            self.embedding_requests.append({"authorization": request.headers.get("authorization"), "body": body})
        dimensions = body.get("dimensions") or self.embedding_dimensions
        data = [{"object": "embedding", "index": i, "embedding": concept_vector(text, dimensions)}
                for i, text in enumerate(inputs)]
        return JSONResponse({"object": "list", "data": data, "model": body.get("model", "fake"),
                             "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}})

    @staticmethod
    def _failure(marker: str) -> JSONResponse:
        if marker == "flaky":
            error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}
            headers = {"retry-after-ms": "300", "retry-after": "1"}
            return JSONResponse({"error": error}, status_code=429, headers=headers)
        error = {"message": "The server is temporarily unavailable", "type": "server_error", "code": None}
        return JSONResponse({"error": error}, status_code=503)
