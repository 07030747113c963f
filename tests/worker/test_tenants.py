"""Tenants across the producers: the CLI's batches belong to a tenant the API can be given a token
for, and the operator can scope corpora per tenant (H13), which the API and the workers enforce and
the unknown-corpus message respects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from typer.testing import CliRunner

from tests.conftest import TEST_TAG_KEY, RedisSpace, ingested_data_dir, worker_env
from tests.worker.conftest import Cluster, question_config, serve, settings_for
from worker.api.app import create_api
from worker.cli import cli
from worker.producer import Producer
from worker.settings import get_settings

runner = CliRunner()
TOKENS = {"tok-ops": "local", "tok-acme": "acme", "tok-globex": "globex"}
SCOPES = {"acme": ["handbook"], "globex": ["atlas"]}


def config_for(corpus: str) -> dict:
    return question_config({"PassageSearchCapability": {"corpus": corpus}})


def status_code(url: str, path: str, token: str) -> int:
    return httpx2.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code


@pytest.fixture
def cli_api(cluster: Cluster, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The CLI's environment pointed at the session worker, and an API over the same Redis."""
    for name, value in (("GROUNDED_REDIS_URL", cluster.space.url), ("GROUNDED_KEY_PREFIX", cluster.space.prefix),
                        ("GROUNDED_DATA_DIR", str(data_dir)), ("GROUNDED_TAG_KEYS", TEST_TAG_KEY)):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GROUNDED_CLI_TENANT", raising=False)
    get_settings.cache_clear()
    settings = settings_for(cluster.space, data_dir, api_tokens=TOKENS)
    with serve(create_api(settings, producer=Producer(settings, store=cluster.store, app=cluster.producer.app))) as url:
        yield url
    get_settings.cache_clear()


def test_cli_batches_belong_to_the_cli_tenant_and_a_token_of_that_tenant_sees_them(
    cli_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"custom_id": "hours", "question": "When does the observatory open?"}) + "\n")
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps(config_for("handbook")))

    def submitted(*options: str) -> str:
        done = runner.invoke(cli, ["submit", str(questions), "--config", str(config), *options])
        assert done.exit_code == 0, done.output
        return done.output.split("batch ", 1)[1].split(":", 1)[0].strip()

    default = submitted()
    assert (status_code(cli_api, f"/v1/batches/{default}", "tok-ops"),
            status_code(cli_api, f"/v1/batches/{default}", "tok-acme")) == (200, 404)
    flagged = submitted("--tenant", "acme")
    assert (status_code(cli_api, f"/v1/batches/{flagged}", "tok-acme"),
            status_code(cli_api, f"/v1/batches/{flagged}", "tok-ops")) == (200, 404)
    monkeypatch.setenv("GROUNDED_CLI_TENANT", "globex")
    get_settings.cache_clear()
    from_env = submitted()
    assert status_code(cli_api, f"/v1/batches/{from_env}", "tok-globex") == 200
    shown = runner.invoke(cli, ["status", from_env])
    assert shown.exit_code == 0 and "globex" in shown.output


def test_experiment_submits_its_arms_as_the_tenant_given(cli_api: str, cluster: Cluster, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"custom_id": "hours", "question": "When does the observatory open?",
                                     "metadata": {"answerable": True}}) + "\n")
    arms = []
    for name, listed in (("off", []), ("on", ["CitationPolicyCapability"])):
        path = tmp_path / f"{name}.yaml"
        config = config_for("handbook")
        config["agent"]["capabilities"] += listed
        path.write_text(json.dumps(config))
        arms += ["--arm", f"{name}={path}"]
    before = set(cluster.store.tenant_batches("acme"))
    done = runner.invoke(cli, ["experiment", str(questions), *arms, "--tenant", "acme", "-o", str(tmp_path / "out"),
                               "--timeout", "60"])
    assert done.exit_code == 0, done.output
    ids = set(cluster.store.tenant_batches("acme")) - before
    assert len(ids) == 2 and all(status_code(cli_api, f"/v1/batches/{b}", "tok-acme") == 200 for b in ids)


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir serving `handbook` and `atlas` (the same documents under two names)."""
    root = ingested_data_dir(tmp_path_factory.mktemp("scoped"), "handbook")
    (root / "corpora" / "atlas.sqlite").write_bytes((root / "corpora" / "handbook.sqlite").read_bytes())
    return root


def rejection(url: str, token: str, corpus: str) -> str:
    response = httpx2.post(f"{url}/v1/batches", headers={"Authorization": f"Bearer {token}"}, timeout=10,
                           json={"config": config_for(corpus), "lines": [{"custom_id": "a", "question": "q?"}]})
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    return error["problem"]


def test_H13_a_tenant_is_told_only_of_its_own_corpora_by_the_api(redis_space: RedisSpace, two_corpora: Path,
                                                                 tmp_path: Path) -> None:
    for data_dir in (two_corpora, tmp_path):  # an API that sees the corpora, and one that does not
        settings = settings_for(redis_space, data_dir, api_tokens=TOKENS, tenant_corpora=SCOPES)
        producer = Producer(settings)
        with serve(create_api(settings, producer=producer)) as url:
            assert rejection(url, "tok-acme", "atlas") == "corpus 'atlas' is not served here; known: handbook"
            assert rejection(url, "tok-globex", "nope") == "corpus 'nope' is not served here; known: atlas"
            assert rejection(url, "tok-ops", "handbook") == "corpus 'handbook' is not served here; known: none"
        producer.app.close()


def test_H13_the_worker_refuses_a_corpus_outside_the_jobs_tenant_scope(
    redis_space: RedisSpace, two_corpora: Path, tmp_path: Path, worker_process
) -> None:
    """A producer that checks nothing (no corpora folder, no scopes) lets both batches through; the
    worker runs globex's and fails acme's, naming only acme's corpora, though the agent for that
    config is already built and cached."""
    worker = worker_process(worker_env(redis_space, two_corpora, GROUNDED_TENANT_CORPORA="acme=handbook,globex=atlas"))
    blind = Producer(settings_for(redis_space, tmp_path))
    cluster = Cluster(redis_space, worker, blind)
    line = [{"custom_id": "hours", "question": "When does the observatory open?"}]
    allowed = cluster.submit(line, config_for("atlas"), tenant="globex")
    assert cluster.wait(allowed).succeeded == 1
    refused = cluster.submit(line, config_for("atlas"), tenant="acme")
    assert cluster.wait(refused).failed == 1
    [result] = cluster.store.iter_results(refused)
    assert result.error is not None and result.error.type == "CompositionError"
    assert result.error.message == "corpus 'atlas' is not served here; known: handbook"
    blind.app.close()


def test_tenant_corpora_read_from_the_environment_as_pairs_or_json() -> None:
    from worker.settings import Settings

    assert Settings(tenant_corpora="acme=transit|handbook, *=public").tenant_corpora == {  # type: ignore[arg-type]
        "acme": ["transit", "handbook"], "*": ["public"]}
    assert Settings(tenant_corpora='{"globex": ["atlas"]}').tenant_corpora == {"globex": ["atlas"]}  # type: ignore[arg-type]
