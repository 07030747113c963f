"""Which models can run a job in provider batch mode (`run.batch`, H17): pure, so the producer refuses
a job at submission with the same words the worker would use.

A provider's batch API is what makes batch mode cheaper; a model without one would either fail on the
worker after the job was queued, or (worse) quietly be sent live at full price. So the refusal comes
before anything is stored. The worker checks the built model again (`batch_max_requests`), which also
catches what a provider string cannot show, such as an Azure client.
"""

from __future__ import annotations

# pydantic-ai 2.68 provider prefixes whose models have a batch API: OpenAI's through the Responses
# model (`openai:` builds it; `openai-chat:` is Chat Completions, which has none), Anthropic's
# Message Batches and Google's batch mode
BATCH_PROVIDERS = frozenset({"openai", "openai-responses", "anthropic", "google", "google-cloud"})
OFFLINE_MODEL = "extractive"  # worker.runtime.extractive.EXTRACTIVE: it runs on the worker, with no provider


def batch_refusal(model: str, *, endpoint_api: str | None) -> str | None:
    """Why `run.batch` cannot be honoured for this model, or None when it can."""
    if endpoint_api is not None:
        if endpoint_api != "responses":
            return ("run.batch needs a batch API, and an OpenAI-compatible endpoint batches only through the "
                    "Responses API (/v1/responses with /v1/files and /v1/batches): set `endpoint.api: responses` "
                    "if the server offers them, or drop run.batch")
        return None
    if model == OFFLINE_MODEL:
        return ("run.batch needs a provider's batch API, and the extractive model runs on the worker itself; "
                "drop run.batch, or name a model such as 'openai:gpt-4.1' or 'anthropic:claude-sonnet-4-5'")
    provider, _, name = model.partition(":")
    if not name or provider not in BATCH_PROVIDERS:
        return (f"run.batch needs a provider with a batch API, and model {model!r} has none here; batch mode "
                f"serves {', '.join(sorted(BATCH_PROVIDERS))} models, or an endpoint with `api: responses`")
    return None
