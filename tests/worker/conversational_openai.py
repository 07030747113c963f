"""A fake OpenAI-compatible model for conversations: the shared fake server, made turn-aware.

It acts on the newest user question (a policy redirect is not one), so every turn of a
conversation searches with its question, cites the first chunk the search showed and answers.
`[down:ID]` and `[slow:ID]` act on the turn whose question carries them, once.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tests.worker.fake_openai import (
    _CHUNK_ID,
    SLOW_S,
    FakeOpenAI,
    _call,
    _completion,
    _text,
)


def answer_for(question: str) -> str:
    return f"Answer to: {question}"


class ConversationalOpenAI(FakeOpenAI):
    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        messages = body.get("messages", [])
        asked = [i for i, m in enumerate(messages)
                 if m.get("role") == "user" and "[cite-request" not in _text(m.get("content"))]
        start = asked[-1]
        question = _text(messages[start].get("content"))
        turn = messages[start + 1 :]
        called = [c["function"]["name"] for m in turn if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        slow = False
        with self.lock:
            self.requests.append({"question": question, "at": time.monotonic(), "body": body,
                                  "authorization": request.headers.get("authorization")})
            for key in re.findall(r"\[down:(\w+)\]", question):
                self.counts[f"down:{key}"] += 1
                if self.counts[f"down:{key}"] == 1:
                    return self._failure("down")
            for key in re.findall(r"\[slow:(\w+)\]", question):
                slow = slow or not self.counts[f"slow:{key}"]
                self.counts[f"slow:{key}"] += 1
        if slow:
            await asyncio.sleep(SLOW_S)
        n = len(messages)
        if "passages_search" not in called:
            query = re.sub(r"\[[^\]]*\]", "", question).strip()
            return JSONResponse(_call(body, "passages_search", json.dumps({"query": query}), n))
        if "passages_cite" not in called:
            shown = [c for m in turn if m.get("role") == "tool" for c in _CHUNK_ID.findall(_text(m.get("content")))]
            return JSONResponse(_call(body, "passages_cite", json.dumps({"chunk_ids": shown[:1]}), n))
        return JSONResponse(_completion(body, {"role": "assistant", "content": answer_for(question)}, "stop"))

    def asked(self, question: str) -> list[dict[str, Any]]:
        """Every request made while `question` was the turn's question, in order."""
        with self.lock:
            return [r for r in self.requests if r["question"] == question]
