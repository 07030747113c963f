"""Model resolution: provider strings, OpenAI-compatible endpoints and the built-in `extractive` model.

Models are resolved on the worker, inside its event loop, from the worker's own environment: a job
names an API key's environment variable, never the key. Every failure here is permanent for the
job (retrying cannot make a key appear), and says what to fix.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import (
    Model,
    ModelRequestParameters,
    StreamedResponse,
    infer_model,
)
from pydantic_ai.models.batch import BatchRequest, EncodedBatchRequest
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from worker.jobs.allowlist import ModelUnavailable, check_endpoint_key, check_model_allowed, model_label
from worker.jobs.models import JobConfig

from .extractive import EXTRACTIVE, ExtractiveModel


def _endpoint_model(config: JobConfig) -> Model:
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    endpoint = config.endpoint
    assert endpoint is not None
    api_key = "api-key-not-set"  # keyless local servers (Ollama, llama.cpp) still need a non-empty value
    if endpoint.api_key_env is not None:
        api_key = os.environ.get(endpoint.api_key_env, "")
        if not api_key:
            raise ModelUnavailable(
                f"endpoint.api_key_env names {endpoint.api_key_env!r}, which is not set in this worker's "
                "environment; set it on every worker (keys never travel in jobs)"
            )
    # max_retries=0: the job's retry policy (H6) is the one place transient errors are retried, so a
    # 429 is retried with its Retry-After and counted in the result's `attempts`.
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=api_key, max_retries=0)
    provider = OpenAIProvider(openai_client=client)
    if endpoint.api == "responses":  # what OpenAI's Batch API runs (H17); chat is what every server speaks
        return OpenAIResponsesModel(config.model, provider=provider)
    return OpenAIChatModel(config.model, provider=provider)


def build_model(config: JobConfig, *, allowlist: Sequence[str] | None = None) -> Model:
    """Call on the worker's event loop: HTTP clients belong to the loop they are used on."""
    check_model_allowed(config, allowlist)
    if config.endpoint is not None:
        return _endpoint_model(config)
    if config.model == EXTRACTIVE:
        return ExtractiveModel()
    try:
        return infer_model(config.model)
    except UserError as exc:
        raise ModelUnavailable(f"model {config.model!r} cannot be used on this worker: {exc}") from None


class ModelCache:
    """One model per (model, endpoint) per process: their HTTP clients keep connections alive."""

    def __init__(
        self, *, allowlist: Sequence[str] | None = None, endpoint_key_bindings: Mapping[str, str] | None = None
    ) -> None:
        self.allowlist = allowlist
        self.endpoint_key_bindings = dict(endpoint_key_bindings or {})
        self._models: dict[str, Model] = {}
        self._lock = threading.Lock()

    def get(self, config: JobConfig) -> Model:
        check_model_allowed(config, self.allowlist)
        check_endpoint_key(config, self.endpoint_key_bindings)
        key = f"{model_label(config)}|{config.endpoint.model_dump_json() if config.endpoint else ''}"
        with self._lock:
            if key not in self._models:
                self._models[key] = build_model(config, allowlist=self.allowlist)
            return self._models[key]


NO_SDK_RETRIES: ModelSettings = {"max_retries": 0}


def sdk_retry_settings(model: Model) -> ModelSettings:
    """H6: the job's retry policy is the one place transient errors are retried, so a model's SDK
    must not retry on its own. Endpoint clients are built that way (`_endpoint_model`); a provider
    model's client is not, and gets the setting. Only when needed: pydantic-ai applies it by copying
    the client for every request, and each copy looks its platform up again on a thread."""
    client = getattr(model, "client", None)
    if getattr(client, "max_retries", None) == 0:
        return {}
    return NO_SDK_RETRIES


class WireRecorder(WrapperModel):
    """Records each request exactly as the model receives it: after every capability's rewrite,
    including the compactor's, which the stored history never shows (H10 `wire`)."""

    def __init__(self, wrapped: Model, sink: list[list[ModelMessage]]) -> None:
        super().__init__(wrapped)
        self.sink = sink

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        self.sink.append(list(messages))
        return await self.wrapped.request(messages, model_settings, model_request_parameters)

    async def batch_encode(self, request: BatchRequest) -> EncodedBatchRequest:
        """In batch mode (H17) a request reaches the model through its batch API instead."""
        self.sink.append(list(request.messages))
        return await self.wrapped.batch_encode(request)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncGenerator[StreamedResponse]:
        self.sink.append(list(messages))
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as stream:
            yield stream
