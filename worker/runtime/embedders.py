"""Embedder resolution: the name a corpus records -> a pydantic-ai Embedder built from this process's settings.

A job never names an embedder: a corpus records the one its vectors came from, and the worker's
own settings say where that model runs. So where query text is sent is the operator's decision
(GROUNDED_EMBEDDING_ENDPOINTS, GROUNDED_EMBEDDING_MODEL_DIRS, the providers' usual key variables),
checked by the same key-binding rule as model endpoints. `grounded ingest --embedder` resolves
names the same way, so ingest and workers embed with the same model.

Names: `PROVIDER:MODEL` for pydantic-ai's providers (`openai:text-embedding-3-small`, `cohere:...`,
`voyageai:...`, ...), `openai-compatible:NAME` for a self-hosted server, and
`sentence-transformers:NAME` for a local model. Every failure here is permanent and says what to fix.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from pydantic_ai.embeddings import Embedder, EmbeddingModel, infer_embedding_model
from pydantic_ai.exceptions import ModelAPIError, UserError

from capabilities.corpus import CorpusEmbedder, EmbeddingError
from worker.jobs.allowlist import ModelUnavailable, check_key_binding
from worker.settings import EmbeddingEndpoint, Settings

OPENAI_COMPATIBLE = "openai-compatible"
LOCAL = "sentence-transformers"
ACCEPTED = (
    "PROVIDER:MODEL for pydantic-ai's embedding providers (openai:text-embedding-3-small, cohere:embed-v4.0, "
    "voyageai:voyage-3.5, ...), openai-compatible:NAME with NAME in GROUNDED_EMBEDDING_ENDPOINTS, or "
    "sentence-transformers:NAME with NAME in GROUNDED_EMBEDDING_MODEL_DIRS (or a local model folder)"
)
WORKER_SDK_RETRIES = 0
"""A worker's query embedding is retried by the job's retry policy (H6), like a model request."""
INGEST_SDK_RETRIES = 2
"""Ingest has no retry policy of its own; the SDK's backoff rides out a brief 429 or 503."""
EMBEDDER_FAILURES = (ModelUnavailable, EmbeddingError, ModelAPIError, UserError)
"""What building or calling an embedder raises outside a job: it cannot be built here (no endpoint,
key or package), its answer is unusable, or its server failed. A job has its own retry policy for
these (H6); a command or a tool reports them in one line."""


def build_embedder(
    model: str,
    *,
    endpoints: Mapping[str, EmbeddingEndpoint],
    key_bindings: Mapping[str, str],
    model_dirs: Mapping[str, Path],
    max_retries: int = WORKER_SDK_RETRIES,
) -> CorpusEmbedder:
    """Call on the event loop that will use it: HTTP clients belong to the loop they are used on."""
    provider, _, name = model.partition(":")
    if not provider or not name:
        raise ModelUnavailable(f"embedder {model!r} has no provider prefix; accepted: {ACCEPTED}")
    built: EmbeddingModel
    if provider == OPENAI_COMPATIBLE:
        built = _endpoint_model(model, name, endpoints, key_bindings, max_retries)
    elif provider == LOCAL:
        built = _local_model(model, name, model_dirs)
    elif provider == "openai":
        built = _openai_model(model, name, max_retries)
    else:
        try:
            built = infer_embedding_model(model)
        except ImportError as exc:
            raise ModelUnavailable(f"embedder {model!r} needs a package this installation lacks: {exc}") from None
        except (UserError, ValueError) as exc:
            raise ModelUnavailable(f"embedder {model!r} cannot be used here: {exc}; accepted: {ACCEPTED}") from None
    return CorpusEmbedder(model, Embedder(built))


def _endpoint_model(
    model: str, name: str, endpoints: Mapping[str, EmbeddingEndpoint], key_bindings: Mapping[str, str],
    max_retries: int,
) -> EmbeddingModel:
    endpoint = endpoints.get(name)
    if endpoint is None:
        known = ", ".join(sorted(endpoints)) or "none"
        raise ModelUnavailable(
            f"embedder {model!r}: no endpoint serves {name!r} here (GROUNDED_EMBEDDING_ENDPOINTS names: {known})"
        )
    api_key = "api-key-not-set"  # keyless servers (TEI, Ollama, llama.cpp) still need a non-empty value
    if endpoint.api_key_env is not None:
        check_key_binding(endpoint.api_key_env, endpoint.base_url, key_bindings,
                          field=f"GROUNDED_EMBEDDING_ENDPOINTS[{name!r}].api_key_env")
        api_key = os.environ.get(endpoint.api_key_env, "")
        if not api_key:
            raise ModelUnavailable(
                f"embedder {model!r}: {endpoint.api_key_env!r} is not set in this process's environment"
            )
    return _openai_embedding_model(name, endpoint.base_url, api_key, max_retries)


def _openai_model(model: str, name: str, max_retries: int) -> EmbeddingModel:
    api_key = os.environ.get("OPENAI_API_KEY", "")
    if not api_key:
        raise ModelUnavailable(f"embedder {model!r} needs OPENAI_API_KEY in this process's environment")
    return _openai_embedding_model(name, os.environ.get("OPENAI_BASE_URL"), api_key, max_retries)


def _openai_embedding_model(name: str, base_url: str | None, api_key: str, max_retries: int) -> EmbeddingModel:
    from openai import AsyncOpenAI
    from pydantic_ai.embeddings.openai import OpenAIEmbeddingModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries)
    return OpenAIEmbeddingModel(name, provider=OpenAIProvider(openai_client=client))


def _local_model(model: str, name: str, model_dirs: Mapping[str, Path]) -> EmbeddingModel:
    folder = model_dirs.get(name) or Path(name)
    if not folder.is_dir():
        known = ", ".join(sorted(model_dirs)) or "none"
        raise ModelUnavailable(
            f"embedder {model!r}: no local folder for {name!r} (GROUNDED_EMBEDDING_MODEL_DIRS names: {known}); "
            "weights are never downloaded at run time"
        )
    try:
        from pydantic_ai.embeddings.sentence_transformers import SentenceTransformerEmbeddingModel
    except ImportError:
        raise ModelUnavailable(
            f"embedder {model!r} needs sentence-transformers: pip install 'grounded-worker[local-embeddings]'"
        ) from None
    return SentenceTransformerEmbeddingModel(str(folder))


class EmbedderCache:
    """One embedder per name per process: their HTTP clients keep connections alive, and a local
    model is loaded once."""

    def __init__(
        self,
        *,
        endpoints: Mapping[str, EmbeddingEndpoint] | None = None,
        key_bindings: Mapping[str, str] | None = None,
        model_dirs: Mapping[str, Path] | None = None,
        max_retries: int = WORKER_SDK_RETRIES,
    ) -> None:
        self.endpoints = dict(endpoints or {})
        self.key_bindings = dict(key_bindings or {})
        self.model_dirs = dict(model_dirs or {})
        self.max_retries = max_retries
        self._embedders: dict[str, CorpusEmbedder] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, *, max_retries: int = WORKER_SDK_RETRIES) -> EmbedderCache:
        return cls(endpoints=settings.embedding_endpoints, key_bindings=settings.endpoint_key_bindings,
                   model_dirs=settings.embedding_model_dirs, max_retries=max_retries)

    def get(self, model: str) -> CorpusEmbedder:
        with self._lock:
            if model not in self._embedders:
                self._embedders[model] = build_embedder(
                    model, endpoints=self.endpoints, key_bindings=self.key_bindings, model_dirs=self.model_dirs,
                    max_retries=self.max_retries,
                )
            return self._embedders[model]
