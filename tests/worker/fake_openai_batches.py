"""A fake OpenAI Batch API on 127.0.0.1 (files, batches, Responses-shaped results), so batch mode
(H17) runs the real OpenAI SDK path: `OpenAIResponsesModel.batch_*` uploads a JSONL file, creates a
batch, polls it and reads the output and error files back.

It plays the same model as tests/worker/fake_openai.py (search with the question, cite the first
chunk shown, answer), through the Responses API, live (`POST /v1/responses`) or in batches.
A batch completes `delay_s` after it was created. Faults:
  expire_batches = N     the next N batches end `expired` without running anything (pydantic-ai
                         resubmits their requests in a new batch)
  [batch-error]          in a question: its request fails in the batch with a 400 (that job's error)
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from typing import Any

from fastapi import Request, UploadFile
from fastapi.responses import JSONResponse, Response

from tests.worker.fake_openai import LocalServer

FAKE_ANSWER = "Fake answer from the knowledge base."
_CHUNK_ID = re.compile(r"^\[([^\]]+)\] \[rank", re.MULTILINE)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _question(items: list[dict[str, Any]]) -> str:
    users = [_text(i.get("content")) for i in items if i.get("role") == "user"]
    return users[0] if users else ""


def answer(body: dict[str, Any], n: int) -> dict[str, Any]:
    """One Responses API response to `body`: what the scripted model does next."""
    items = body.get("input", [])
    items = items if isinstance(items, list) else [{"role": "user", "content": items}]
    question = _question(items)
    tools = {t.get("name") for t in body.get("tools", [])}
    called = [i.get("name") for i in items if i.get("type") == "function_call"]
    shown = [c for i in items if i.get("type") == "function_call_output" for c in _CHUNK_ID.findall(_text(i.get("output")))]
    if "passages_search" in tools and "passages_search" not in called:
        query = re.sub(r"\[[^\]]*\]", "", question).strip()
        output = [_call("passages_search", {"query": query}, n)]
    elif "passages_cite" in tools and "passages_cite" not in called:
        output = [_call("passages_cite", {"chunk_ids": shown[:1]}, n)]
    else:
        output = [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": FAKE_ANSWER, "annotations": []}]}]
    return {
        "id": f"resp_{uuid.uuid4().hex[:12]}", "object": "response", "created_at": int(time.time()),
        "model": body.get("model", "fake"), "status": "completed", "output": output,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }


def _call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{name}_{n}", "call_id": f"call_{name}_{n}", "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}


class FakeOpenAIBatches(LocalServer):
    def __init__(self, *, delay_s: float = 0.5, live_latency_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.live_latency_s = live_latency_s  # how long a live request takes (bench/provider_batch.py)
        self.expire_batches = 0
        self.lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.live_requests = 0
        self.batch_requests = 0  # requests submitted in batches (every line of every input file)
        self.cancelled: list[str] = []
        self.n = 0
        self.app.post("/v1/responses")(self.responses)
        self.app.post("/v1/files")(self.upload)
        self.app.get("/v1/files/{file_id}/content")(self.content)
        self.app.delete("/v1/files/{file_id}")(self.delete_file)
        self.app.post("/v1/batches")(self.create)
        self.app.get("/v1/batches/{batch_id}")(self.retrieve)
        self.app.post("/v1/batches/{batch_id}/cancel")(self.cancel)

    def reset(self, *, delay_s: float = 0.5) -> None:
        with self.lock:
            self.delay_s, self.expire_batches, self.live_requests, self.batch_requests = delay_s, 0, 0, 0
            self.batches.clear()
            self.cancelled.clear()

    def _next(self) -> int:
        with self.lock:
            self.n += 1
            return self.n

    async def responses(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self.lock:
            self.live_requests += 1
        if self.live_latency_s:
            await asyncio.sleep(self.live_latency_s)
        return JSONResponse(answer(body, self._next()))

    async def upload(self, file: UploadFile) -> JSONResponse:
        data = await file.read()
        file_id = f"file-{uuid.uuid4().hex[:16]}"
        with self.lock:
            self.files[file_id] = data
        return JSONResponse(self._file(file_id, data, "batch"))

    @staticmethod
    def _file(file_id: str, data: bytes, purpose: str) -> dict[str, Any]:
        return {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": f"{file_id}.jsonl", "purpose": purpose, "status": "processed"}

    async def content(self, file_id: str) -> Response:
        with self.lock:
            data = self.files.get(file_id)
        if data is None:
            return JSONResponse({"error": {"message": "No such file", "type": "invalid_request_error"}},
                                status_code=404)
        return Response(data, media_type="application/jsonl")

    async def delete_file(self, file_id: str) -> JSONResponse:
        with self.lock:
            self.files.pop(file_id, None)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    async def create(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self.lock:
            lines = self.files[body["input_file_id"]].decode().splitlines()
            self.batch_requests += len(lines)
            expire = self.expire_batches > 0
            self.expire_batches -= expire
            batch_id = f"batch_{uuid.uuid4().hex[:16]}"
            self.batches[batch_id] = {
                "id": batch_id, "object": "batch", "endpoint": body["endpoint"], "errors": None,
                "input_file_id": body["input_file_id"], "completion_window": body["completion_window"],
                "status": "in_progress", "created_at": int(time.time()), "output_file_id": None,
                "error_file_id": None, "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                "_ready_at": time.monotonic() + self.delay_s, "_expire": expire,
            }
            return JSONResponse(self._public(batch_id))

    def _public(self, batch_id: str) -> dict[str, Any]:
        return {k: v for k, v in self.batches[batch_id].items() if not k.startswith("_")}

    def _finish(self, batch: dict[str, Any]) -> None:
        """Runs every line of an input file (under the lock), writing the output and error files."""
        if batch["_expire"]:
            batch["status"] = "expired"
            return
        outputs, errors = [], []
        for line in self.files[batch["input_file_id"]].decode().splitlines():
            request = json.loads(line)
            self.n += 1
            if "[batch-error]" in _question(request["body"].get("input", [])):
                error = {"message": "Invalid request: the model refused this input", "type": "invalid_request_error",
                         "code": "invalid_prompt"}
                errors.append({"id": f"req_{self.n}", "custom_id": request["custom_id"],
                               "response": {"status_code": 400, "request_id": f"r{self.n}", "body": {"error": error}},
                               "error": None})
                continue
            outputs.append({"id": f"req_{self.n}", "custom_id": request["custom_id"],
                            "response": {"status_code": 200, "request_id": f"r{self.n}",
                                         "body": answer(request["body"], self.n)}, "error": None})
        for kind, rows in (("output_file_id", outputs), ("error_file_id", errors)):
            if rows:
                file_id = f"file-{uuid.uuid4().hex[:16]}"
                self.files[file_id] = "\n".join(json.dumps(r) for r in rows).encode()
                batch[kind] = file_id
        batch["status"] = "completed"
        batch["request_counts"] = {"total": len(outputs) + len(errors), "completed": len(outputs),
                                   "failed": len(errors)}

    async def retrieve(self, batch_id: str) -> JSONResponse:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return JSONResponse({"error": {"message": "No such batch", "type": "invalid_request_error"}},
                                    status_code=404)
            if batch["status"] == "in_progress" and time.monotonic() >= batch["_ready_at"]:
                self._finish(batch)
            return JSONResponse(self._public(batch_id))

    async def cancel(self, batch_id: str) -> JSONResponse:
        with self.lock:
            batch = self.batches[batch_id]
            if batch["status"] == "in_progress":
                batch["status"] = "cancelled"
                self.cancelled.append(batch_id)
            return JSONResponse(self._public(batch_id))

    def statuses(self) -> dict[str, str]:
        with self.lock:
            return {batch_id: batch["status"] for batch_id, batch in self.batches.items()}
