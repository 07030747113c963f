"""Two-arm experiments (V2): submit the same questions once per arm and repeat, wait, and report.

`run_experiment` submits and waits; `run_compare` reports on batches already run. Both end in
`build_report`, so a report means the same whichever way its batches were made. The commands that
call them are in `experiment_cli`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.jobs.models import Batch, JobConfig, JobResult
from worker.polling import StillWaiting, poll_until
from worker.producer import Producer
from worker.settings import Settings
from worker.store.results import BatchNotFound, BatchProgress, ResultsStore

from .judges import Judgements, ModelJudge, judge_results
from .models import Report
from .report import ArmRuns, build_report, render_html
from .scoring import Reviews

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
REVIEW_TEMPLATE = "review.jsonl"


class ExperimentError(ValueError):
    """An experiment that cannot be run or reported as asked; says what to change."""


@dataclass(frozen=True)
class ArmSpec:
    name: str
    config_text: str


def parse_arm(value: str) -> tuple[str, str]:
    """`NAME=VALUE`, as `--arm off=off.yaml` and `compare off=BATCH` write it."""
    name, sep, rest = value.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ExperimentError(f"{value!r} is not NAME=VALUE (e.g. off=examples/eval/off.yaml)")
    return name.strip(), rest.strip()


def read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def v2_differences(configs: Mapping[str, JobConfig]) -> list[str]:
    """V2: arms may differ only by the policy. Anything else (model, budgets, instructions, corpus)
    would confound the comparison, so the report says what else differs."""
    def without_policy(config: JobConfig) -> dict[str, Any]:
        data = config.model_dump(mode="json")
        data["agent"]["capabilities"] = [
            c for c in data["agent"].get("capabilities") or [] if c != "CitationPolicyCapability"
            and not (isinstance(c, dict) and "CitationPolicyCapability" in c)
        ]
        return data

    names = list(configs)
    notes = []
    base = without_policy(configs[names[0]])
    for name in names[1:]:
        other = without_policy(configs[name])
        keys = sorted(_diff_paths(base, other))
        if keys:
            notes.append(
                f"V2: arms {names[0]!r} and {name!r} differ in more than the policy: {', '.join(keys)}"
            )
    return notes


def _diff_paths(a: Any, b: Any, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for key in set(a) | set(b):
            out |= _diff_paths(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return set() if a == b else {prefix.rstrip(".") or "config"}


def question_notes(arms: Sequence[ArmRuns]) -> list[str]:
    """V2: every run asks the same questions in the same order; the report says where one did not."""
    notes = []
    first = [r.custom_id for r in arms[0].runs[0]]
    for arm in arms:
        for index, run in enumerate(arm.runs):
            ids = [r.custom_id for r in run]
            if ids != first:
                notes.append(f"V2: {arm.name} run {index + 1} does not hold the same questions in the same order "
                             f"as {arms[0].name} run 1")
    return notes


def submit_arms(
    producer: Producer, lines: Sequence[str], arms: Sequence[ArmSpec], *, repeat: int, tenant: str
) -> dict[str, list[Batch]]:
    """Every arm and repeat is validated before anything is stored, so a bad config enqueues nothing.
    Repeats interleave the arms (off, on, off, on, ...) so that drift in a shared endpoint falls on both."""
    reports = {}
    for arm in arms:
        report = producer.validate(lines, arm.config_text, tenant=tenant)
        if not report.ok:
            problems = "; ".join(str(e) for e in report.errors[:10])
            raise ExperimentError(f"arm {arm.name!r}: {problems}")
        reports[arm.name] = report
    batches: dict[str, list[Batch]] = {arm.name: [] for arm in arms}
    for _ in range(repeat):
        for arm in arms:
            batches[arm.name].append(producer.submit(reports[arm.name], tenant=tenant, arm=arm.name))
    return batches


def wait_for(
    store: ResultsStore,
    batch_ids: Sequence[str],
    *,
    timeout_s: float,
    on_progress: Callable[[list[BatchProgress]], None] = lambda _: None,
    poll_s: float = 0.5,
) -> list[BatchProgress]:
    try:
        return poll_until(lambda: [store.progress_of(b) for b in batch_ids], lambda ps: all(p.finished for p in ps),
                          timeout_s=timeout_s, interval_s=poll_s, on_each=on_progress)
    except BatchNotFound as exc:
        raise ExperimentError(str(exc)) from None
    except StillWaiting as exc:
        raise ExperimentError(
            f"not finished after {timeout_s:g} s: "
            + ", ".join(f"{p.batch_id} {p.done}/{p.total}" for p in exc.last if not p.finished)
            + "; the batches keep running: report on them later with `grounded compare`"
        ) from None


def collect(store: ResultsStore, batches: Mapping[str, Sequence[str]]) -> list[ArmRuns]:
    return [
        ArmRuns(name, [list(store.iter_results(b)) for b in ids], list(ids)) for name, ids in batches.items()
    ]


def arm_batches_notes(store: ResultsStore, batches: Mapping[str, Sequence[str]]) -> list[str]:
    notes: list[str] = []
    configs: dict[str, JobConfig] = {}
    for name, ids in batches.items():
        for batch_id in ids:
            batch = store.load_batch(batch_id)
            progress = store.progress(batch_id)
            if batch is None or progress is None:
                raise ExperimentError(f"batch {batch_id!r} not found in this results store")
            configs.setdefault(name, batch.config)
            if batch.config.digest() != configs[name].digest():
                notes.append(f"V2: arm {name!r} mixes batches with different configs ({batch_id})")
            if not progress.finished:
                notes.append(f"batch {batch_id} ({name}) is still running: {progress.done} of {progress.total} "
                             "finished; this report covers those")
            if progress.cancelled:
                notes.append(f"batch {batch_id} ({name}): {progress.cancelled} job(s) cancelled, not evaluated")
    return v2_differences(configs) + notes


def evaluate(
    arms: Sequence[ArmRuns],
    *,
    signer: Any,
    judge_config: JobConfig | None = None,
    reviews: Reviews | None = None,
    notes: Sequence[str] = (),
) -> Report:
    """Judges with the configured judge model, else the rule-based judge, then builds the report."""
    judgements: Judgements | None = None
    if judge_config is not None:
        everything: list[JobResult] = [r for arm in arms for run in arm.runs for r in run]
        judgements = asyncio.run(judge_results(everything, ModelJudge.from_config(judge_config)))
    return build_report(
        arms, signer=signer, judgements=judgements, reviews=reviews, notes=[*notes, *question_notes(arms)]
    )


def review_template(report: Report) -> list[dict[str, Any]]:
    """One line per answer for a reviewer to fill in `invented` (V4), then pass back with --review."""
    lines = []
    for q in report.questions:
        for arm, rows in q.arms.items():
            for index, row in enumerate(rows):
                if row is None:
                    continue
                lines.append({
                    "job_id": row.job_id, "arm": arm, "run": index + 1, "custom_id": q.custom_id,
                    "question": q.question, "answer": row.answer, "status": row.status,
                    "cited": [{"chunk_id": c.chunk_id, "content": c.content} for c in row.cited],
                    "invented": row.invented,
                })
    return lines


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / REPORT_JSON, out_dir / REPORT_HTML
    json_path.write_text(report.model_dump_json(indent=2))
    html_path.write_text(render_html(report))
    template = out_dir / REVIEW_TEMPLATE
    if not template.exists():  # never overwrite a reviewer's work
        template.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in review_template(report)))
    return json_path, html_path


def load_judge(path: Path | None) -> JobConfig | None:
    return JobConfig.from_text(path.read_text()) if path is not None else None


def run_experiment(
    settings: Settings,
    questions: Path,
    arms: Sequence[ArmSpec],
    *,
    repeat: int,
    timeout_s: float,
    judge_config: JobConfig | None = None,
    reviews: Reviews | None = None,
    on_submitted: Callable[[Mapping[str, Sequence[Batch]]], None] = lambda _: None,
    on_progress: Callable[[list[BatchProgress]], None] = lambda _: None,
) -> Report:
    """Submits every arm and repeat, waits for all of them, and returns the report."""
    if not arms or len({a.name for a in arms}) != len(arms):
        raise ExperimentError("give each arm once, with a distinct name: --arm off=A.yaml --arm on=B.yaml")
    signer = settings.signer()  # before submitting: without the workers' keys nothing could be counted
    producer = Producer(settings)
    try:
        batches = submit_arms(producer, read_lines(questions), arms, repeat=repeat, tenant=settings.cli_tenant)
    finally:
        producer.app.close()
    on_submitted(batches)
    ids = {name: [b.id for b in bs] for name, bs in batches.items()}
    wait_for(producer.store, [b for bs in ids.values() for b in bs], timeout_s=timeout_s, on_progress=on_progress)
    return evaluate(collect(producer.store, ids), signer=signer, judge_config=judge_config, reviews=reviews,
                    notes=arm_batches_notes(producer.store, ids))


def run_compare(
    settings: Settings,
    batches: Sequence[str],
    *,
    judge_config: JobConfig | None = None,
    reviews: Reviews | None = None,
) -> Report:
    """`[NAME=]ID[,ID...]` per arm, baseline first; a name defaults to the batch's arm label."""
    signer = settings.signer()
    store = ResultsStore.from_url(settings.redis_url, prefix=settings.key_prefix)
    arms: dict[str, list[str]] = {}
    for index, value in enumerate(batches):
        name, ids = parse_arm(value) if "=" in value else (None, value)
        id_list = [i.strip() for i in ids.split(",") if i.strip()]
        first = store.load_batch(id_list[0]) if id_list else None
        if first is None:
            raise ExperimentError(f"batch {ids!r} not found in this results store")
        name = name or first.arm or f"arm{index + 1}"
        arms[name if name not in arms else f"{name}-{index + 1}"] = id_list
    return evaluate(collect(store, arms), signer=signer, judge_config=judge_config, reviews=reviews,
                    notes=arm_batches_notes(store, arms))
