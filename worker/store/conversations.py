"""Stored conversations: one history, one `deps.state` and one composition, committed together.

Identities and epochs are positions in the history (L7), so the history and the state must only
ever move together: a commit writes both with a compare-and-set on a version, or nothing (H4).
Follow-ups run with the composition the conversation started with (H3), one job at a time under a
per-conversation lock (H5). Producers never write history or state here; only workers do.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from worker.jobs.composition import COMPACTOR, PASSAGES, POLICY, Composition
from worker.jobs.models import JobConfig, TurnResult
from worker.settings import Settings

from . import retention
from .keys import CONVERSATION_JOBS_KEY, CONVERSATION_KEY, CONVERSATION_LOCK_KEY, CONVERSATION_TURNS_KEY
from .results import ResultsStore
from .scripts import eval_script

# Created once: a conversation job and the producer may both create it, and only the first counts.
_CREATE = """
if redis.call('HSETNX', KEYS[1], 'meta', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'version', 0, 'length', 0, 'messages', ARGV[2], 'state', ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[4])
return 1
"""

_ADD_JOB = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
"""

# H4: history, state and the turn's result move together, and only from the version the run loaded.
_COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local version = tonumber(redis.call('HGET', KEYS[1], 'version'))
if version ~= tonumber(ARGV[1]) then return -1 end
redis.call('HSET', KEYS[1], 'messages', ARGV[2], 'state', ARGV[3], 'length', ARGV[4], 'version', version + 1)
redis.call('RPUSH', KEYS[2], ARGV[5])
return version + 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class ConversationNotFound(LookupError):
    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} not found")
        self.conversation_id = conversation_id


class ConcurrentUpdate(RuntimeError):
    """H5's second line of defence: another job committed to this conversation since this run loaded
    it, so this run's history would not follow from the stored one. Nothing was committed."""


class CompositionMismatch(ValueError):
    """H3. Capabilities must not come and go within a conversation (L2 agreement, C14 judges each
    namespace on its own), so a follow-up runs with the composition the conversation started with."""

    def __init__(self, conversation_id: str, differences: list[str]) -> None:
        super().__init__(
            f"conversation {conversation_id!r} keeps the composition it started with (H3), and this config "
            + "; ".join(differences)
            + ". Send the follow-up without a config to use the stored one."
        )
        self.differences = differences


def evidence_namespace(capability: str) -> str:
    """The `deps.state` key a listed evidence capability writes: its class's default namespace."""
    from capabilities import DocumentReaderCapability, PassageSearchCapability

    cls = PassageSearchCapability if capability == PASSAGES else DocumentReaderCapability
    return str(next(f.default for f in fields(cls) if f.name == "namespace"))


class StoredComposition(BaseModel):
    """What H3 fixes: which evidence namespaces (with their options), and whether the compactor and
    the policy are registered."""

    model_config = ConfigDict(frozen=True)

    evidence: dict[str, dict[str, Any]]  # namespace -> {"capability": type name, **options}
    policy: bool
    compactor: bool

    @classmethod
    def of(cls, composition: Composition) -> StoredComposition:
        return cls(
            evidence={
                evidence_namespace(entry.name): {"capability": entry.name, **entry.options.model_dump(mode="json")}
                for entry in composition.evidence
            },
            policy=composition.policy_listed,
            compactor=composition.compactor_listed,
        )


def composition_differences(stored: StoredComposition, requested: StoredComposition) -> list[str]:
    """Each difference in words, naming the capability (and namespace) it concerns; [] when equal."""
    out = []
    for ns in sorted(set(requested.evidence) - set(stored.evidence)):
        out.append(f"adds {requested.evidence[ns]['capability']} (namespace {ns!r})")
    for ns in sorted(set(stored.evidence) - set(requested.evidence)):
        out.append(f"removes {stored.evidence[ns]['capability']} (namespace {ns!r})")
    for ns in sorted(set(stored.evidence) & set(requested.evidence)):
        before, after = stored.evidence[ns], requested.evidence[ns]
        changed = [f"{key} {before.get(key)!r} -> {after.get(key)!r}"
                   for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
        if changed:
            out.append(f"changes {after['capability']} (namespace {ns!r}): {', '.join(changed)}")
    switches = ((POLICY, stored.policy, requested.policy), (COMPACTOR, stored.compactor, requested.compactor))
    for name, was, now in switches:
        if was != now:
            out.append(f"{'adds' if now else 'removes'} {name}")
    return out


class ConversationMeta(BaseModel):
    id: str
    tenant: str
    config: JobConfig  # what a follow-up without a config runs with
    composition: StoredComposition
    created_at: datetime


class StoredTurn(BaseModel):
    """One committed question, with the H10 result it produced (a resumed job reports it again)."""

    job_id: str
    custom_id: str
    result: TurnResult


@dataclass(frozen=True)
class StoredConversation:
    """One consistent snapshot: what a run starts from, and the version its commit must find."""

    meta: ConversationMeta
    messages: list[ModelMessage]
    state: dict[str, Any]
    version: int
    turns: list[StoredTurn]

    def turns_of(self, job_id: str) -> tuple[TurnResult, ...]:
        return tuple(t.result for t in self.turns if t.job_id == job_id)


def lock_ttl_s(settings: Settings) -> int:
    """H5, H14: a lease, like the job's delivery: its live holder renews it (worker/tasks/leases.py),
    and a dead worker's lock expires on its own within the recovery time, not after a job's limit."""
    return settings.lease_s


@dataclass(eq=False)  # held in a set by identity while renewed (tasks/leases.py)
class ConversationLock:
    store: ConversationStore
    key: str
    token: str
    released: bool = False

    def release(self) -> bool:
        """Compare-token delete: a lock that expired and was taken by another job stays theirs."""
        self.released = True
        return bool(self.store._release(keys=[self.key], args=[self.token]))

    def release_in(self, pipe: Any) -> None:
        """The same delete, queued on a transaction: the job's result write lets go of the lock in
        the transaction that finishes the job (H5), so a client that sees the job's batch finished
        and sends the next turn at once finds the conversation free, not locked for a moment more
        (which would put that turn back by a retry's countdown)."""
        self.released = True
        eval_script(pipe, _RELEASE, [self.key], [self.token])

    def renew(self, ttl_s: int) -> bool:
        """Compare-token expiry: False once the lock expired and is someone else's (or no one's);
        a lock its holder already let go of has nothing to renew."""
        if self.released:
            return True
        return bool(self.store._renew(keys=[self.key], args=[self.token, ttl_s * 1000]))


class ConversationStore:
    """Conversations beside the results store, under the same prefix and Redis client."""

    def __init__(self, results: ResultsStore) -> None:
        self.results = results
        self.redis = results.redis
        self._release = self.redis.register_script(_RELEASE)
        self._renew = self.redis.register_script(_RENEW)

    def _key(self, template: str, conversation_id: str) -> str:
        return self.results.key(template, conversation_id=conversation_id)

    # --- producers and workers --------------------------------------------------------------------

    def _retained(self, conversation_id: str) -> list[str]:
        """The keys that live as long as the conversation (the lock has its own short expiry)."""
        return [self._key(template, conversation_id)
                for template in (CONVERSATION_KEY, CONVERSATION_JOBS_KEY, CONVERSATION_TURNS_KEY)]

    def create(self, conversation_id: str, *, tenant: str, config: JobConfig, job_id: str, batch_id: str,
               pipe: Any = None) -> None:
        """Idempotent: the conversation job that starts it becomes its first job, once. It belongs to
        that job's batch (gone with it when the batch is), and outlives it only while follow-ups
        continue it (H16)."""
        if pipe is None:
            with self.redis.pipeline(transaction=True) as own:
                self.create(conversation_id, tenant=tenant, config=config, job_id=job_id, batch_id=batch_id, pipe=own)
                own.execute()
            return
        meta = ConversationMeta(id=conversation_id, tenant=tenant, config=config,
                                composition=StoredComposition.of(config.composition), created_at=datetime.now(UTC))
        keys = [self._key(CONVERSATION_KEY, conversation_id), self._key(CONVERSATION_JOBS_KEY, conversation_id)]
        args = [meta.model_dump_json(), self.results._pack("[]"), self.results._pack("{}"), job_id]
        eval_script(pipe, _CREATE, keys, args)
        self.results.retain(pipe, batch_id, *keys, extend=True)

    def add_job(self, conversation_id: str, job_id: str, *, batch_id: str) -> None:
        """Records a follow-up's place in line; jobs run in this order (H5). The conversation lives at
        least as long as the follow-up's batch, so a continued conversation is never cut off (H16)."""
        keys = [self._key(CONVERSATION_KEY, conversation_id), self._key(CONVERSATION_JOBS_KEY, conversation_id)]
        with self.redis.pipeline(transaction=True) as pipe:
            eval_script(pipe, _ADD_JOB, keys, [job_id])
            self.results.retain(pipe, batch_id, *self._retained(conversation_id), extend=True, drop=False)
            added, _ = pipe.execute()
        if not added:
            raise ConversationNotFound(conversation_id)

    # --- readers ----------------------------------------------------------------------------------

    def load_meta(self, conversation_id: str) -> ConversationMeta | None:
        raw = self.redis.hget(self._key(CONVERSATION_KEY, conversation_id), "meta")
        return ConversationMeta.model_validate_json(raw) if raw is not None else None

    def load(self, conversation_id: str) -> StoredConversation | None:
        """History, state, version and turns read in one transaction, so they belong together."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self._key(CONVERSATION_KEY, conversation_id), "meta", "messages", "state", "version")
            pipe.lrange(self._key(CONVERSATION_TURNS_KEY, conversation_id), 0, -1)
            (meta, messages, state, version), turns = pipe.execute()
        if meta is None:
            return None
        return StoredConversation(
            meta=ConversationMeta.model_validate_json(meta),
            messages=ModelMessagesTypeAdapter.validate_json(self.results._unpack(messages)),
            state=json.loads(self.results._unpack(state)),
            version=int(version),
            turns=[StoredTurn.model_validate_json(self.results._unpack(t)) for t in turns],
        )

    def turns(self, conversation_id: str) -> list[StoredTurn]:
        raw = self.redis.lrange(self._key(CONVERSATION_TURNS_KEY, conversation_id), 0, -1)
        return [StoredTurn.model_validate_json(self.results._unpack(t)) for t in raw]

    def summary(self, conversation_id: str) -> tuple[int, int]:
        """(version, history length) without loading the history."""
        version, length = self.redis.hmget(self._key(CONVERSATION_KEY, conversation_id), "version", "length")
        return int(version or 0), int(length or 0)

    def job_ids(self, conversation_id: str) -> list[str]:
        return [j.decode() for j in self.redis.lrange(self._key(CONVERSATION_JOBS_KEY, conversation_id), 0, -1)]

    # --- workers ----------------------------------------------------------------------------------

    def commit(self, conversation_id: str, *, version: int, messages: list[ModelMessage], state: dict[str, Any],
               turn: StoredTurn) -> int:
        """H4: returns the new version, or raises ConcurrentUpdate having written nothing."""
        keys = [self._key(CONVERSATION_KEY, conversation_id), self._key(CONVERSATION_TURNS_KEY, conversation_id)]
        args = [
            version,
            self.results._pack(ModelMessagesTypeAdapter.dump_json(messages).decode()),
            self.results._pack(json.dumps(state, separators=(",", ":"))),
            len(messages),
            self.results._pack(turn.model_dump_json()),
        ]
        with self.redis.pipeline(transaction=True) as pipe:
            eval_script(pipe, _COMMIT, keys, args)
            # the turns list is new at the first commit: it takes the conversation's expiry (H16)
            retention.retain(pipe, keys[0], keys[1:], extend=True, drop=False)
            committed, _ = pipe.execute()
        new = int(committed)
        if new == -2:
            raise ConversationNotFound(conversation_id)
        if new < 0:
            raise ConcurrentUpdate(
                f"conversation {conversation_id!r} changed since this run loaded version {version}; "
                "nothing was committed"
            )
        return new

    def lock(self, conversation_id: str, *, ttl_s: int) -> ConversationLock | None:
        """H5: None while another job holds it."""
        key = self._key(CONVERSATION_LOCK_KEY, conversation_id)
        token = secrets.token_hex(16)
        if not self.redis.set(key, token, nx=True, px=ttl_s * 1000):
            return None
        return ConversationLock(self, key, token)
