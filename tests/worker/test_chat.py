"""`grounded chat` through a pseudo-terminal (pexpect), as a person types it: questions answered
through the queue by the session's real worker, on stored conversations, with the compactor."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pytest
import yaml

from tests.conftest import REPO, TEST_TAG_KEY
from tests.worker.conftest import PASSAGES, POLICY, Cluster, question_config
from worker.interfaces.chat import registering_compactor
from worker.jobs.models import JobConfig

PROMPT = "you> "
CONVERSATION = re.compile(r"conversation (job_[0-9a-f]+) \(/resume")


@pytest.fixture
def chat_env(cluster: Cluster, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(GROUNDED_REDIS_URL=cluster.space.url, GROUNDED_KEY_PREFIX=cluster.space.prefix,
               GROUNDED_DATA_DIR=str(data_dir), GROUNDED_TAG_KEYS=TEST_TAG_KEY, GROUNDED_CLI_TENANT="acme",
               NO_COLOR="1", TERM="dumb", PYTHONWARNINGS="ignore")
    return env


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "chat.yaml"  # no compactor listed: the chat registers it (I6)
    path.write_text(yaml.safe_dump(question_config(PASSAGES, POLICY)))
    return path


def spawn(env: dict[str, str], *args: str) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "worker.cli", "chat", *args], cwd=str(REPO), env=env,
                         encoding="utf-8", timeout=60, dimensions=(50, 250))


def ask(child: pexpect.spawn, question: str) -> str:
    """Types a question and returns what the chat printed before the next prompt."""
    child.sendline(question)
    child.expect_exact(question)  # the terminal echoes what was typed
    child.expect_exact(PROMPT)
    return child.before


def test_I6_a_chat_keeps_one_conversation_starts_over_and_resumes(chat_env: dict[str, str], config_file: Path,
                                                                    cluster: Cluster) -> None:
    child = spawn(chat_env, "--config", str(config_file))
    child.expect_exact("/resume ID continues one")
    child.expect_exact(PROMPT)

    first = ask(child, "When does the observatory open?")
    started = CONVERSATION.search(first)
    assert started, first
    conversation_id = started.group(1)
    assert "19:00" in first and "\ngrounded" in first
    assert re.search(r"\[1\] Oakridge Observatory Handbook, page 1 \(\S+\)", first), first

    second = ask(child, "How large is the reflector mirror?")
    assert "400 mm" in second and "grounded" in second and not CONVERSATION.search(second)

    assert "new conversation" in ask(child, "/new")
    other = ask(child, "Who painted the Mona Lisa?")
    assert "ungrounded" in other and CONVERSATION.search(other)
    assert CONVERSATION.search(other).group(1) != conversation_id  # type: ignore[union-attr]

    resumed = ask(child, f"/resume {conversation_id}")
    assert f"resumed conversation {conversation_id}: 2 turns so far" in resumed and "400 mm" in resumed
    third = ask(child, "When does the observatory open?")
    assert "19:00" in third
    assert f"conversation {conversation_id}" in ask(child, "/id")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    turns = cluster.producer.conversations.turns(conversation_id)
    assert [t.result.question_text for t in turns] == [
        "When does the observatory open?", "How large is the reflector mirror?", "When does the observatory open?"]
    identities = [t.result.question_identity for t in turns]
    assert identities[0] == 0 and identities == sorted(identities) and len(set(identities)) == 3
    results = [cluster.store.load_result(t.job_id) for t in turns]
    assert [r.kind for r in results if r] == ["conversation", "follow_up", "follow_up"]
    assert all(r is not None and r.compactor_registered and r.policy_registered for r in results)
    meta = cluster.producer.conversations.load_meta(conversation_id)
    assert meta is not None and meta.tenant == "acme" and meta.composition.compactor


def test_I5_chat_resumes_only_its_tenants_conversations(chat_env: dict[str, str], config_file: Path,
                                                        cluster: Cluster) -> None:
    """Another tenant's conversation reads as not found; `--tenant` names that tenant and resumes it."""
    batch_id = cluster.submit([{"custom_id": "theirs", "turns": ["When does the observatory open?"]}],
                              question_config(PASSAGES), tenant="globex")
    [job_id] = cluster.store.job_ids(batch_id)
    child = spawn(chat_env, "--config", str(config_file), "--conversation", job_id)
    child.expect_exact(f"conversation {job_id!r} not found")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1

    child = spawn(chat_env, "--config", str(config_file), "--conversation", job_id, "--tenant", "globex")
    child.expect_exact(f"resumed conversation {job_id}: 1 turn so far")
    child.expect_exact(PROMPT)
    assert "400 mm" in ask(child, "How large is the reflector mirror?")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    turns = cluster.producer.conversations.turns(job_id)
    assert [t.result.question_text for t in turns] == ["When does the observatory open?",
                                                       "How large is the reflector mirror?"]


def test_I6_registering_the_compactor_keeps_the_rest_of_the_config() -> None:
    config = JobConfig.model_validate(question_config(PASSAGES, POLICY))
    registered = registering_compactor(config)
    assert registered.composition.compactor_listed and registered.composition.policy_listed
    assert registered.agent["capabilities"][:2] == config.agent["capabilities"]
    assert registering_compactor(registered) == registered
