"""`grounded experiment` end to end: real Redis, a real Celery worker, the offline extractive model,
the labelled set in examples/eval, and the report opened in a headless browser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, RedisSpace, worker_env
from tests.worker.test_report import assert_not_blank, screenshot
from worker.evaluation.experiment import REPORT_HTML, REPORT_JSON, REVIEW_TEMPLATE
from worker.jobs.models import JobConfig

EVAL = REPO / "examples" / "eval"
GROUNDED = [sys.executable, "-m", "worker.cli"]
CORPUS_DIR = REPO / "examples" / "corpus"


def eval_corpus() -> str:
    (name,) = JobConfig.from_text((EVAL / "on.yaml").read_text()).composition.corpora
    return name


@pytest.fixture(scope="module")
def eval_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples corpus, ingested under the name the eval configs use."""
    from capabilities.corpus import ingest

    root = tmp_path_factory.mktemp("eval-data")
    (root / "corpora").mkdir()
    ingest(root / "corpora" / f"{eval_corpus()}.sqlite", [CORPUS_DIR])
    return root


def grounded(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GROUNDED, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_examples_eval_set_is_shaped_like_the_reference_measurement():
    """V3: 37 items, 8 answerable with a reference answer and gold documents, 29 unanswerable."""
    items = [json.loads(line) for line in (EVAL / "questions.jsonl").read_text().splitlines() if line.strip()]
    answerable = [i for i in items if i["metadata"]["answerable"] is True]
    unanswerable = [i for i in items if i["metadata"]["answerable"] is False]
    assert (len(items), len(answerable), len(unanswerable)) == (37, 8, 29)
    assert len({i["custom_id"] for i in items}) == 37
    corpus_files = {p.name for p in CORPUS_DIR.glob("*.md")}
    for item in answerable:
        assert item["metadata"]["reference_answer"]
        assert set(item["metadata"]["gold_documents"]) <= corpus_files, item


def test_V2_eval_arms_differ_only_by_the_policy():
    from worker.evaluation.experiment import v2_differences

    off = JobConfig.from_text((EVAL / "off.yaml").read_text())
    on = JobConfig.from_text((EVAL / "on.yaml").read_text())
    assert (off.composition.policy_listed, on.composition.policy_listed) == (False, True)
    assert v2_differences({"off": off, "on": on}) == []


def test_grounded_experiment_runs_both_arms_end_to_end(redis_space: RedisSpace, eval_data_dir: Path, worker_process,
                                                      tmp_path: Path):
    env = worker_env(redis_space, eval_data_dir)
    worker_process(env)
    out = tmp_path / "report"
    run = grounded("experiment", str(EVAL / "questions.jsonl"), "--arm", f"off={EVAL / 'off.yaml'}",
                   "--arm", f"on={EVAL / 'on.yaml'}", "--repeat", "2", "-o", str(out), "--timeout", "180", env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((out / REPORT_JSON).read_text())
    off, on = report["arms"]
    assert (off["name"], on["name"]) == ("off", "on")
    assert (off["policy_registered"], on["policy_registered"]) == (False, True)
    for arm in (off, on):
        assert len(arm["runs"]) == len(arm["batches"]) == 2  # V8: per-run values, and their mean
        metrics = arm["runs"][0]
        assert arm["runs"][1]["ungrounded_declarations"] == metrics["ungrounded_declarations"]  # deterministic
        assert arm["mean"]["ungrounded_declarations"] == metrics["ungrounded_declarations"]
        assert (metrics["questions"], metrics["answerable"], metrics["unanswerable"], metrics["failed"]) == (37, 8, 29, 0)
        assert metrics["model"] == "extractive"
        assert metrics["invented"] is None  # nobody has read the answers yet
    assert off["runs"][0]["redirects"] == 0 and off["runs"][0]["violations"] == 0  # V5: arm OFF is necessarily 0
    # The extractive model always cites (possibly nothing), so the policy has nothing to ask for: V8's
    # directions hold with equality, and the two arms agree question by question.
    for key in ("ungrounded_declarations", "grounded_unanswerable", "answerable_answered", "undeclared"):
        assert on["runs"][0][key] == off["runs"][0][key], key
    assert on["runs"][0]["redirects"] == 0 and on["runs"][0]["undeclared"] == 0
    assert report["notes"] == []
    assert report["judge"].startswith("rule-based judge")
    assert [q["custom_id"] for q in report["questions"]][:5] == ["u01", "u02", "u03", "u04", "a01"]
    page = (out / REPORT_HTML).read_text()
    assert "<table id=metrics>" in page and page.count("<svg") == 2
    template = [json.loads(line) for line in (out / REVIEW_TEMPLATE).read_text().splitlines()]
    assert len(template) == 148 and all(line["invented"] is None for line in template)

    compared = grounded("compare", off["batches"][0], on["batches"][0], "-o", str(tmp_path / "compare"), env=env)
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]
    again = json.loads((tmp_path / "compare" / REPORT_JSON).read_text())
    assert [a["name"] for a in again["arms"]] == ["off", "on"]  # the batches' arm labels
    assert again["arms"][1]["runs"][0]["rows"] == report["arms"][1]["runs"][0]["rows"]

    reviewed = tmp_path / "reviewed.jsonl"  # V4: a reviewer read every answer and found nothing invented
    reviewed.write_text("".join(json.dumps({**line, "invented": 0}) + "\n" for line in template))
    named = grounded("compare", f"baseline={','.join(off['batches'])}", f"policy={','.join(on['batches'])}",
                     "--review", str(reviewed), "-o", str(tmp_path / "named"), env=env)
    assert named.returncode == 0, named.stdout[-3000:] + named.stderr[-3000:]
    both = json.loads((tmp_path / "named" / REPORT_JSON).read_text())
    assert [(a["name"], len(a["runs"])) for a in both["arms"]] == [("baseline", 2), ("policy", 2)]
    assert [r["values"] for r in both["table"] if r["metric"] != "invented"] == [
        {"baseline": r["values"]["off"], "policy": r["values"]["on"]} for r in report["table"] if r["metric"] != "invented"
    ]
    invented = next(r for r in both["table"] if r["metric"] == "invented")
    assert invented["values"] == {"baseline": "0", "policy": "0"} and invented["differences"] == {"policy − baseline": "0"}

    png = tmp_path / "report.png"  # last: without a browser this skips, after everything else was checked
    shot = screenshot(out / REPORT_HTML, png)
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    assert_not_blank(png)


def test_grounded_experiment_refuses_a_bad_arm_before_enqueueing(redis_space: RedisSpace, eval_data_dir: Path,
                                                                 tmp_path: Path):
    env = worker_env(redis_space, eval_data_dir)
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  model: extractive\n  capabilities:\n    - PassageSearchCapability: {corpus: nowhere}\n")
    run = grounded("experiment", str(EVAL / "questions.jsonl"), "--arm", f"off={EVAL / 'off.yaml'}",
                   "--arm", f"on={bad}", "-o", str(tmp_path / "out"), env=env)
    assert run.returncode == 2
    assert "arm 'on'" in run.stderr and "nowhere" in run.stderr
    assert redis_space.store().tenant_batches("local") == []  # nothing was stored for either arm


def test_V6_grounded_experiment_needs_the_workers_tag_keys_before_submitting(redis_space: RedisSpace,
                                                                            eval_data_dir: Path, tmp_path: Path):
    env = worker_env(redis_space, eval_data_dir, GROUNDED_TAG_KEYS=None)
    run = grounded("experiment", str(EVAL / "questions.jsonl"), "--arm", f"off={EVAL / 'off.yaml'}",
                   "--arm", f"on={EVAL / 'on.yaml'}", "-o", str(tmp_path / "out"), env=env)
    assert run.returncode == 2 and "GROUNDED_TAG_KEYS" in run.stderr
    assert redis_space.store().tenant_batches("local") == []
