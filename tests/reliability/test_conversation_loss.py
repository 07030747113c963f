"""Conversations survive worker loss: kill -9 the pool child running a conversation after some of its
turns are committed, and the redelivered job resumes at the first uncommitted turn.

Committed turns are never asked again (the model saw each of them exactly once), every question is
in the stored history once and in order, identities continue where they were, and each job still
ends with exactly one result.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.reliability.conftest import PASSAGES, endpoint_config, live_children
from tests.reliability.faulty_openai import SlowConversationalOpenAI
from tests.worker.test_conversations import (
    MESSAGES_PER_TURN,
    QUESTIONS,
    history_questions,
)
from worker.store.conversations import ConversationStore

pytestmark = pytest.mark.slow

CONVERSATIONS = 3
TURNS = 3
CONVERSATION_KILLS = CONVERSATIONS
REQUESTS_PER_TURN = 3  # search, cite, answer


@pytest.fixture(scope="module")
def slow_chat() -> Iterator[SlowConversationalOpenAI]:
    server = SlowConversationalOpenAI().start()
    yield server
    server.stop()


def test_conversations_killed_mid_turn_resume_at_their_first_uncommitted_turn(
    redis_space, fleet_for, slow_chat: SlowConversationalOpenAI
) -> None:
    # a dead worker's conversation lock is a lease that expires in seconds (H14), whatever the limit
    fleet = fleet_for(redis_space)
    worker = fleet.start(pool="prefork", concurrency=CONVERSATIONS)
    turns = {f"conv-{c}": [f"{q} (conversation {c})" for q in QUESTIONS[:TURNS]] for c in range(CONVERSATIONS)}
    batch_id = fleet.submit([{"custom_id": c, "turns": t} for c, t in turns.items()], endpoint_config(slow_chat, PASSAGES))
    conversations = ConversationStore(fleet.store)
    jobs = {job_id: fleet.store.load_job(job_id) for job_id in fleet.store.job_ids(batch_id)}
    committed_at_kill: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while len(committed_at_kill) < CONVERSATIONS:
        assert time.monotonic() < deadline, worker.output()[-3000:]
        children = live_children(worker.process.pid)
        for task in fleet.active(worker):
            job = jobs[task["id"]]
            version, _ = conversations.summary(job.conversation_id)
            asked = turns[job.custom_id]
            in_flight = 1 <= version < TURNS and slow_chat.asked(asked[version])  # the next turn reached the model
            if job.id not in committed_at_kill and in_flight and task["worker_pid"] in children:
                fleet.kill(task["worker_pid"], "prefork child mid-conversation", job.id)
                committed_at_kill[job.id] = version
        time.sleep(0.2)

    progress = fleet.wait(batch_id, timeout=120)
    assert (progress.succeeded, progress.failed, progress.done) == (CONVERSATIONS, 0, CONVERSATIONS)
    results = {r.job_id: r for r in fleet.store.iter_results(batch_id)}
    assert results.keys() == jobs.keys()
    for job_id, committed in committed_at_kill.items():
        result, asked = results[job_id], turns[jobs[job_id].custom_id]
        assert result.status == "succeeded" and result.attempts == 2
        assert [t.question_text for t in result.turns] == asked
        assert [t.question_identity for t in result.turns] == [MESSAGES_PER_TURN * k for k in range(TURNS)]
        stored = conversations.load(jobs[job_id].conversation_id)
        assert stored is not None and stored.version == TURNS and history_questions(stored.messages) == asked
        assert [len(slow_chat.asked(q)) for q in asked[:committed]] == [REQUESTS_PER_TURN] * committed
        assert len(slow_chat.asked(asked[committed])) >= REQUESTS_PER_TURN  # the killed turn ran again, whole
    assert len(fleet.kills) == CONVERSATION_KILLS
