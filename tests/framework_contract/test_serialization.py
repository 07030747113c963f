"""F18: what survives a history round trip, and what a vision API never sees (docs/design/rules/framework.md)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx2
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.harness import PNG

IDENTIFIER = "pic-identifier-1"
OUTCOMES = ["success", "failed", "denied", "interrupted", "retried"]


def _history() -> list[ModelMessage]:
    content: list[Any] = ["before", BinaryContent(PNG, media_type="image/png", identifier=IDENTIFIER), "after"]
    returns = [
        ToolReturnPart(tool_name="t", content=f"r-{outcome}", tool_call_id=f"c-{outcome}", outcome=outcome)  # type: ignore[arg-type]
        for outcome in OUTCOMES
    ]
    return [ModelRequest(parts=[*returns, UserPromptPart(content)])]


def test_F18_round_trip_keeps_list_content_order_bytes_and_outcomes() -> None:
    """Observed beyond the spec: the JSON carries the bytes as URL-safe base64 ('-'/'_', not '+'/'/'), and the
    loaded image is a BinaryImage (a BinaryContent subclass), so the loaded history does not compare == to the
    original: compare fields, not whole messages."""
    dumped = ModelMessagesTypeAdapter.dump_json(_history())
    (loaded,) = ModelMessagesTypeAdapter.validate_json(dumped)

    raw = json.loads(dumped)[0]["parts"][-1]["content"][1]
    assert raw["data"] == base64.urlsafe_b64encode(PNG).decode()
    assert isinstance(loaded, ModelRequest)
    *returns, prompt = loaded.parts
    assert [(r.content, r.outcome) for r in returns] == [(f"r-{o}", o) for o in OUTCOMES]  # type: ignore[union-attr]
    assert isinstance(prompt, UserPromptPart) and isinstance(prompt.content, list)
    before, image, after = prompt.content
    assert (before, after) == ("before", "after")
    assert isinstance(image, BinaryContent)
    assert (image.data, image.media_type, image.identifier) == (PNG, "image/png", IDENTIFIER)
    assert loaded != _history()[0]


async def test_F18_binary_content_identifier_is_not_sent_to_a_vision_api() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        return httpx2.Response(
            200,
            json={
                "id": "cmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "vision",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "seen"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    model = OpenAIChatModel(
        "vision", provider=OpenAIProvider(base_url="http://vision.invalid/v1", api_key="sk-test", http_client=client)
    )

    result = await Agent(model).run(["look", BinaryContent(PNG, media_type="image/png", identifier=IDENTIFIER)])

    assert result.output == "seen"
    (body,) = bodies
    assert IDENTIFIER not in json.dumps(body)
    (message,) = body["messages"]
    assert message["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}},
    ]
