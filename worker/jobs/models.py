"""The job language's models: configs, batches, jobs and their results (H10).

What a producer stores and a worker reads. Validating a whole batch of lines into these is
`worker.jobs.lines`; which capabilities a config may list is `worker.jobs.composition`.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_ai.agent.spec import AgentSpec

from worker.settings import Settings

from .batching import batch_refusal
from .composition import Composition, CompositionError, read_composition
from .problems import problem

JobKind = Literal["question", "conversation", "follow_up"]
CitationStatus = Literal["grounded", "ungrounded", "missing"]  # L10: what grounds one answer

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORKER_SETTINGS = frozenset(f"GROUNDED_{name.upper()}" for name in Settings.model_fields)
_AGENT_KEYS = frozenset(f.alias or name for name, f in AgentSpec.model_fields.items()) | {"$schema"}


class Endpoint(BaseModel):
    """An OpenAI-compatible server (vLLM, Ollama, llama.cpp). The key is named, never sent:
    secrets live in the worker's environment, not in jobs that anyone with a token can read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    api_key_env: str | None = None
    # which OpenAI API the server speaks: Chat Completions (every compatible server) or Responses,
    # which OpenAI's own Batch API needs (run.batch)
    api: Literal["chat", "responses"] = "chat"

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url {value!r} must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"api_key_env {value!r} must be an environment variable name, not a key")
        if value is not None and value.upper() in _WORKER_SETTINGS:
            raise ValueError(f"api_key_env {value!r} names one of the worker's own settings; the job chooses "
                             "base_url, so that value would be sent to whatever server it names")
        return value


class RunOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    request_limit: int = Field(default=12, ge=1, le=500)  # model requests per run (pydantic-ai UsageLimits)
    timeout_s: float = Field(default=300, gt=0, le=86_400)  # one job's runs, all turns together
    retries: int = Field(default=3, ge=0, le=20)  # re-runs after transient model errors (H6)
    # H17: model requests go through the provider's batch API (about half the price, results within
    # 24 hours); the job frees its worker slot while the provider works, and resumes on any worker
    batch: bool = False


class JobConfig(BaseModel):
    """`agent` is a pydantic-ai agent spec (what `Agent.from_spec` reads), restricted by `composition`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: dict[str, Any]
    endpoint: Endpoint | None = None
    run: RunOptions = RunOptions()
    # keep this batch for less than the deployment's GROUNDED_RETENTION_DAYS (never more: H16)
    retention_days: float | None = Field(default=None, gt=0)

    @field_validator("agent")
    @classmethod
    def _agent(cls, agent: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(agent) - _AGENT_KEYS)
        if unknown:
            raise ValueError(f"agent has unknown keys {unknown}; an agent spec has {sorted(_AGENT_KEYS)}")
        model = agent.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ValueError("agent.model is required: 'extractive', a provider string such as "
                             "'openai:gpt-4.1', or the model name served by `endpoint`")
        try:
            AgentSpec.model_validate(agent)
        except ValidationError as exc:
            raise ValueError(problem(exc.errors()[0], prefix="agent")) from None
        try:
            read_composition(agent.get("capabilities"))
        except CompositionError as exc:
            raise ValueError(str(exc)) from None
        return agent

    @model_validator(mode="after")
    def _batch(self) -> JobConfig:
        refusal = batch_refusal(self.model, endpoint_api=self.endpoint.api if self.endpoint else None) \
            if self.run.batch else None
        if refusal:
            raise ValueError(refusal)
        return self

    @property
    def model(self) -> str:
        return self.agent["model"]

    @property
    def endpoint_key_names(self) -> tuple[str, ...]:
        """The worker variables this config has a key read from (its secrets, whatever their names)."""
        return (self.endpoint.api_key_env,) if self.endpoint and self.endpoint.api_key_env else ()

    @property
    def composition(self) -> Composition:
        return read_composition(self.agent.get("capabilities"))

    def digest(self) -> str:
        """Agents are cached per process by this: equal configs build equal agents."""
        return self._digest

    @cached_property
    def _digest(self) -> str:
        """Once per instance (the model is frozen): a worker reads one batch's config for each of its jobs."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def from_text(cls, text: str) -> JobConfig:
        """YAML or JSON (JSON is YAML)."""
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:  # a submitter's typo is a 422 naming the problem, not a crash
            raise ValueError(f"the config is not valid YAML or JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"a job config is a mapping with `agent`, got {type(data).__name__}")
        return cls.model_validate(data)


class JobSpec(BaseModel):
    """One validated line, before the store gives it an id."""

    line_no: int
    custom_id: str
    kind: JobKind
    question: str | None = None
    turns: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    conversation_id: str | None = None  # a follow_up's stored conversation; set by the store otherwise

    def prompts(self) -> list[str]:
        """One prompt per question the job asks, in order (one for a `question` job)."""
        return [self.question] if self.question is not None else list(self.turns)


class Job(JobSpec):
    id: str
    batch_id: str


class Batch(BaseModel):
    id: str
    tenant: str
    config: JobConfig
    total: int
    created_at: datetime
    arm: str | None = None
    expires_at: datetime | None = None  # when it and everything under it leave Redis (H16); None: kept


class CitedChunk(BaseModel):
    capability: str
    chunk_id: str
    document_id: str | None = None
    document_uri: str | None = None
    document_title: str | None = None
    content: str = ""
    page_numbers: list[int] = Field(default_factory=list)  # where the chunk sits, for citations a reader can follow
    headings: list[str] = Field(default_factory=list)  # the section it sits in, outermost first
    retrieved_this_question: bool = False


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0


class TurnResult(BaseModel):
    """H10: what evaluation reads about one question."""

    question_identity: int
    question_text: str
    answer: str | dict[str, Any] | list[Any] | None
    citation_status: CitationStatus
    declared_refs: list[dict[str, str]] = Field(default_factory=list)
    cited: list[CitedChunk] = Field(default_factory=list)
    redirects: int = 0
    violation: bool = False
    n_requests: int = 0
    tool_calls: dict[str, int] = Field(default_factory=dict)
    failed_tool_returns: int = 0
    retried_tool_returns: int = 0
    usage: Usage = Usage()
    wire: list[list[dict[str, Any]]] = Field(default_factory=list)  # each request as sent; pictures as digests
    new_messages_json: bytes = b"[]"  # ModelMessagesTypeAdapter.dump_json(result.new_messages())


class JobError(BaseModel):
    type: str
    message: str


class JobResult(BaseModel):
    """H10: one per job, written once (idempotent on redelivery)."""

    job_id: str
    batch_id: str
    custom_id: str
    kind: JobKind
    conversation_id: str | None = None
    arm: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    status: Literal["succeeded", "failed"]
    error: JobError | None = None
    model: str
    endpoint: str | None = None
    policy_registered: bool = False
    compactor_registered: bool = False
    turns: list[TurnResult] = Field(default_factory=list)
    state_after: dict[str, Any] = Field(default_factory=dict)
    attempts: int = 1
    started_at: datetime
    finished_at: datetime
    # H17: how the model was reached ("live", or "batch" through the provider's batch API), the
    # provider batches the job's requests went through, its provider round trips, its usage, and
    # what it cost by genai-prices (batch prices for batch results; None when a price is unknown)
    processing: Literal["live", "batch"] = "live"
    provider_batches: list[str] = Field(default_factory=list)
    rounds: int = 0
    usage: Usage = Usage()
    cost_usd: float | None = None
