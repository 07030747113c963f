"""Worker, API and CLI settings, read once from `GROUNDED_*` environment variables.

Everything that differs between machines (Redis, where corpora live, secrets) comes from here;
jobs never carry paths or keys, so a job file means the same thing on every worker.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from capabilities import TagSigner

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_RETENTION_DAYS = 30.0  # as long as the hosted batch APIs keep results
DAY_S = 86_400


class MissingTagKeys(RuntimeError):
    """H8. A worker without tag keys could neither sign nor verify our tags, so it must not start."""

    def __init__(self) -> None:
        super().__init__(
            "GROUNDED_TAG_KEYS is not set: every worker needs the same tag keys (newest first, "
            "comma-separated or a JSON list) to sign and verify picture and redirect tags (H8, T1)"
        )


def _split_list(value: Any) -> Any:
    """Comma-separated for shells, or a JSON list for tools that write JSON."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [item.strip() for item in text.split(",") if item.strip()]
    return value


class EmbeddingEndpoint(BaseModel):
    """Where the worker sends texts for an `openai-compatible:NAME` embedder (TEI, vLLM, Ollama,
    llama.cpp): its own setting, never the job's or the corpus's, so no job decides where query
    text goes. A key variable must also be bound to the URL (GROUNDED_ENDPOINT_KEY_BINDINGS)."""

    base_url: str
    api_key_env: str | None = None


class Settings(BaseSettings):
    """One object for every process role; each role reads only what it needs."""

    model_config = SettingsConfigDict(env_prefix="GROUNDED_", extra="ignore")

    redis_url: str = DEFAULT_REDIS_URL
    data_dir: Path = Path(".grounded")  # corpora under data_dir/corpora/NAME.sqlite; jobs name a corpus
    key_prefix: str = "grounded:"  # every Redis key we and Celery's transport write starts with it
    tag_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)  # newest first (T1)
    api_tokens: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)  # bearer token -> tenant
    cli_tenant: str = "local"  # the tenant the CLI submits as when it talks to Redis directly
    # Flower's own variable (user:password[,user2:password2]): Flower reads it, `grounded flower`
    # only refuses to start without it, since Flower without auth leaves its UI open to anyone
    flower_basic_auth: SecretStr | None = Field(default=None, validation_alias=AliasChoices("FLOWER_BASIC_AUTH"))

    task_soft_limit_s: int = Field(default=600, ge=1)  # the longest a job's runs may take in total
    task_hard_limit_s: int = Field(default=660, ge=1)  # prefork kills the child here; threads cannot be killed
    concurrency: int = Field(default=8, ge=1)  # jobs in flight per worker process (threads pool)
    processes: int | None = Field(default=None, ge=1)  # `grounded worker` processes per host; None: one per core
    pool: str = "threads"  # LLM-bound jobs wait on HTTP, so threads give concurrency without processes
    model_allowlist: Annotated[list[str] | None, NoDecode] = None  # fnmatch patterns; None allows any model
    # tenant -> the corpora its jobs may name (H13; `*` for every other tenant, or for every corpus);
    # empty: every tenant may name every corpus the workers serve
    tenant_corpora: Annotated[dict[str, list[str]], NoDecode] = Field(default_factory=dict)
    # endpoint key variable -> the base_url pattern it may be sent to; a job chooses its base_url, so
    # an unbound key is never read (models.check_endpoint_key)
    endpoint_key_bindings: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    # served model NAME of an `openai-compatible:NAME` embedder -> its endpoint (runtime/embedders.py)
    embedding_endpoints: Annotated[dict[str, EmbeddingEndpoint], NoDecode] = Field(default_factory=dict)
    # NAME of a `sentence-transformers:NAME` embedder -> the local folder holding its weights
    # (weights are never downloaded at run time)
    embedding_model_dirs: Annotated[dict[str, Path], NoDecode] = Field(default_factory=dict)
    retry_base_s: float = Field(default=2.0, gt=0)  # transient model errors back off from here...
    retry_max_s: float = Field(default=60.0, gt=0)  # ...up to here, also when the provider asks for longer
    # H14: a delivery is a lease its live worker renews (worker/tasks/leases.py); a dead worker's jobs
    # are back on the queue about lease_s + the sweep interval after its last renewal, whatever the
    # job time limit (docs/design/architecture.md, "Queue")
    lease_s: int = Field(default=10, ge=2)
    # kombu sweeps for expired leases every interval * throttle seconds
    unacked_restore_interval_s: int = Field(default=2, ge=1)
    unacked_restore_throttle: int = Field(default=1, ge=1)
    # H18: how often one worker of the fleet looks for jobs whose message the broker lost (taken
    # from the queue but never recorded as delivered); such a job is re-sent after two sweeps
    orphan_sweep_s: float = Field(default=30.0, gt=0)
    # H15: on SIGTERM a worker takes no new jobs and lets running ones finish for this long, then
    # hands the rest back to the queue (worker/tasks/shutdown.py); keep it well under the pod's grace
    soft_shutdown_s: float = Field(default=60.0, ge=0)
    worker_name: str | None = None  # a worker's node name, NAME@HOST; unset: grounded-PID@HOST
    # a job whose worker died under it this many times is failed, not redelivered again (a poison
    # job); hand-backs at shutdown are not deaths and do not count (H15)
    max_worker_losses: int = Field(default=8, ge=1)
    max_batch_lines: int = Field(default=100_000, ge=1)
    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # the API refuses larger bodies (413)
    compress_over_bytes: int = Field(default=16_384, ge=0)  # results larger than this are stored compressed
    # a batch and everything under it expire this long after submission; a config may ask for less (H16)
    retention_days: float = Field(default=DEFAULT_RETENTION_DAYS, gt=0)
    # name -> job config file (YAML/JSON) the operator serves to callers that cannot send a config:
    # MCP tools, OpenAI Batch lines (`body.model` names one), `grounded chat` (I1, worker.jobs.served)
    configs: Annotated[dict[str, Path], NoDecode] = Field(default_factory=dict)
    default_config: str | None = None  # the name used when a caller names none; unset: the only one served
    # provider batch mode (run.batch, H17): one batching capability per worker process submits what its
    # jobs queued after batch_max_wait_s (or at batch_max_requests); a waiting job is checked after
    # batch_poll_s, then half again as long each time, up to batch_max_poll_s
    batch_max_wait_s: float = Field(default=5.0, gt=0)
    batch_max_requests: int = Field(default=50_000, ge=1)
    batch_max_resubmissions: int = Field(default=2, ge=0)  # expired or transiently failed requests, sent again
    batch_poll_s: float = Field(default=30.0, gt=0)
    batch_max_poll_s: float = Field(default=600.0, gt=0)

    @field_validator("tag_keys", mode="before")
    @classmethod
    def _tag_keys(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("model_allowlist", mode="before")
    @classmethod
    def _allowlist(cls, value: Any) -> Any:
        if value in (None, ""):
            return None
        return _split_list(value)

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> Any:
        return _pairs(value, "GROUNDED_API_TOKENS", "token=tenant")

    @field_validator("configs", mode="before")
    @classmethod
    def _configs(cls, value: Any) -> Any:
        return _pairs(value, "GROUNDED_CONFIGS", "name=path")

    @field_validator("tenant_corpora", mode="before")
    @classmethod
    def _tenant_corpora(cls, value: Any) -> Any:
        """`acme=transit|handbook,globex=atlas,*=public`, or a JSON object of lists."""
        pairs = _pairs(value, "GROUNDED_TENANT_CORPORA", "tenant=corpus|corpus")
        if not isinstance(pairs, dict):
            return pairs
        return {tenant: [n.strip() for n in names.split("|") if n.strip()] if isinstance(names, str) else names
                for tenant, names in pairs.items()}

    @field_validator("endpoint_key_bindings", mode="before")
    @classmethod
    def _endpoint_key_bindings(cls, value: Any) -> Any:
        return _pairs(value, "GROUNDED_ENDPOINT_KEY_BINDINGS", "VARIABLE=base-url-pattern")

    @field_validator("embedding_endpoints", mode="before")
    @classmethod
    def _embedding_endpoints(cls, value: Any) -> Any:
        pairs = _pairs(value, "GROUNDED_EMBEDDING_ENDPOINTS", "NAME=base-url")
        if isinstance(pairs, dict):
            return {name: {"base_url": v} if isinstance(v, str) else v for name, v in pairs.items()}
        return pairs

    @field_validator("embedding_model_dirs", mode="before")
    @classmethod
    def _embedding_model_dirs(cls, value: Any) -> Any:
        return _pairs(value, "GROUNDED_EMBEDDING_MODEL_DIRS", "NAME=folder")

    @model_validator(mode="after")
    def _limits(self) -> Settings:
        if self.task_hard_limit_s < self.task_soft_limit_s:
            raise ValueError("GROUNDED_TASK_HARD_LIMIT_S must not be below GROUNDED_TASK_SOFT_LIMIT_S")
        if self.batch_max_poll_s < self.batch_poll_s:
            raise ValueError("GROUNDED_BATCH_MAX_POLL_S must not be below GROUNDED_BATCH_POLL_S")
        return self

    @property
    def corpora_dir(self) -> Path:
        return self.data_dir / "corpora"

    @property
    def retention_s(self) -> float:
        return self.retention_days * DAY_S

    def signer(self) -> TagSigner:
        """H8/T1: every worker signs with the newest key and verifies with all of them."""
        keys = [key.get_secret_value().encode() for key in self.tag_keys if key.get_secret_value()]
        if not keys:
            raise MissingTagKeys()
        return TagSigner(keys)


def _pairs(value: Any, variable: str, shape: str) -> Any:
    """A JSON object, or `key=value` pairs separated by commas."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return {}
    if text.startswith("{"):
        return json.loads(text)
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"{variable} must be a JSON object or {shape} pairs")
    return {key.strip(): val.strip() for key, val in pairs}


@lru_cache
def get_settings() -> Settings:
    """One Settings per process; tests build their own `Settings(...)` instead of touching the cache."""
    return Settings()
