"""A chat on a stored conversation, through the queue: the first question starts a conversation
job, each later one is a follow-up turn on it, and every answer is read from its job's result.

The terminal shell is `worker.cli.chat`; this holds what a chat is, so any host could drive it.
A chat is multi-turn, so it registers the compactor (I6): a config that does not list it gets it
added. A resumed conversation keeps the composition it started with (H3), compactor or not.
"""

from __future__ import annotations

from worker.jobs.composition import COMPACTOR
from worker.jobs.models import Job, JobConfig, JobResult
from worker.producer import NotFound, Producer
from worker.store.conversations import ConversationMeta, StoredTurn

CHAT_CUSTOM_ID = "chat"


def registering_compactor(config: JobConfig) -> JobConfig:
    """I6: the config as a chat runs it, the compactor listed."""
    if config.composition.compactor_listed:
        return config
    agent = {**config.agent, "capabilities": [*(config.agent.get("capabilities") or []), COMPACTOR]}
    return JobConfig.model_validate({**config.model_dump(mode="json"), "agent": agent})


class ChatSession:
    """One user's chat: at most one conversation at a time, started by the next question after
    `start_over()`, or taken up again with `resume(id)`."""

    def __init__(self, producer: Producer, *, tenant: str, config: JobConfig) -> None:
        self.producer, self.tenant = producer, tenant
        self.config = registering_compactor(config)
        self.conversation_id: str | None = None

    def start_over(self) -> None:
        self.conversation_id = None

    def resume(self, conversation_id: str) -> tuple[ConversationMeta, list[StoredTurn]]:
        """Raises NotFound for a conversation that is not this tenant's."""
        meta = self.producer.conversations.load_meta(conversation_id)
        if meta is None or meta.tenant != self.tenant:
            raise NotFound("conversation", conversation_id)
        self.conversation_id = conversation_id
        return meta, self.producer.conversations.turns(conversation_id)

    def send(self, question: str) -> Job:
        """Queues the question; raises JobLineError for text that cannot be a question (nothing queued),
        or ConversationNotFound / CompositionMismatch from the follow-up."""
        if self.conversation_id is not None:
            return self.producer.follow_up(self.conversation_id, question, tenant=self.tenant)
        report = self.producer.validate([{"custom_id": CHAT_CUSTOM_ID, "turns": [question]}], self.config,
                                        tenant=self.tenant)
        if not report.ok:
            raise report.errors[0]
        batch = self.producer.submit(report, tenant=self.tenant)
        [job_id] = self.producer.store.job_ids(batch.id)
        job = self.producer.store.load_job(job_id)
        assert job is not None and job.conversation_id is not None
        self.conversation_id = job.conversation_id
        return job

    def wait(self, job: Job, *, timeout_s: float) -> JobResult | None:
        """The job's result as soon as it is written, or None if it is still running after
        `timeout_s` (its answer still lands in the conversation)."""
        return self.producer.store.wait_result(job.id, job.batch_id, timeout_s)
