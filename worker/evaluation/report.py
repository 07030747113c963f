"""The evaluation report: arms side by side (report.json), rendered as one self-contained HTML page.

The page holds the seed-style table (V7's metrics, one column per arm, with the difference), the
charts, a per-question table (V8 asks for one) and every answer with its citations, so a reviewer
can read each answer where its numbers come from, offline.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from capabilities import TagSigner
from worker.jobs.models import JobResult

from .charts import behaviour_chart, status_chart
from .judges import Judgements, rule_judgements
from .scoring import STATUSES, Reviews, compute, mean_of


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    out_of: str | None = None  # shown as value/denominator
    needs_policy: bool = False  # meaningless for an arm without the policy
    decimals: int = 0


# V5 in V7's order: what the reference measurement reported, then the operational numbers.
METRICS: tuple[Metric, ...] = (
    Metric("ungrounded_declarations", "Explicit ungrounded declarations"),
    Metric("ungrounded_declarations_unanswerable", "… on unanswerable questions", out_of="unanswerable"),
    Metric("ungrounded_declarations_answerable", "… on answerable questions", out_of="answerable"),
    Metric("grounded_unanswerable", "Grounded answers to unanswerable questions", out_of="unanswerable"),
    Metric("answerable_answered", "Answerable questions answered", out_of="answerable"),
    Metric("answerable_grounded", "Answerable questions grounded", out_of="answerable"),
    Metric("redirects", "Redirects fired"),
    Metric("violations", "Violations", needs_policy=True),
    Metric("undeclared", "Undeclared (status missing)"),
    Metric("invented", "Invented grounding"),
    Metric("mean_n_requests", "Mean model requests per question", decimals=2),
    Metric("redirect_requests", "Extra requests from redirects"),
    Metric("refusal.precision", "Refusal precision (vs. unanswerable)", decimals=2),
    Metric("refusal.recall", "Refusal recall", decimals=2),
    Metric("refusal.f1", "Refusal F1", decimals=2),
    Metric("questions", "Questions evaluated"),
    Metric("failed", "Failed jobs (excluded from every count)"),
)
MEAN_KEYS: tuple[str, ...] = (
    *(m.key for m in METRICS),
    "answerable",
    "unanswerable",
    *(f"status.{split}.{s}" for split in ("all", "answerable", "unanswerable") for s in STATUSES),
)


@dataclass(frozen=True)
class ArmRuns:
    """One arm of an experiment: a batch per repeat, the same questions in the same order (V2)."""

    name: str
    runs: Sequence[Sequence[JobResult]]
    batch_ids: Sequence[str] = field(default_factory=tuple)


def build_report(
    arms: Sequence[ArmRuns],
    *,
    signer: TagSigner,
    judgements: Judgements | None = None,
    reviews: Reviews | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    if not arms:
        raise ValueError("a report needs at least one arm")
    everything = [r for arm in arms for run in arm.runs for r in run]
    judgements = judgements or rule_judgements(everything)
    arm_reports = []
    for arm in arms:
        runs = [compute(run, signer=signer, judgements=judgements, reviews=reviews) for run in arm.runs]
        arm_reports.append({
            "name": arm.name,
            "batches": list(arm.batch_ids),
            "model": _same([run["model"] for run in runs]),
            "policy_registered": _same([run["policy_registered"] for run in runs]),
            "runs": runs,
            "mean": {key: mean_of(runs, key) for key in MEAN_KEYS},
        })
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "judge": judgements.judge,
        "arms": arm_reports,
        "table": _table(arm_reports),
        "questions": _questions(arm_reports),
        "notes": list(notes),
    }


def _same(values: Sequence[Any]) -> Any:
    distinct = {str(v): v for v in values}
    return next(iter(distinct.values())) if len(distinct) == 1 else "mixed"


def _value(run: Mapping[str, Any], key: str) -> Any:
    value: Any = run
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _fmt(value: Any, decimals: int) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and (decimals or not value.is_integer()):
        return f"{value:.{max(decimals, 2)}f}"
    return str(int(value)) if isinstance(value, (int, float)) else str(value)


def _cell(metric: Metric, arm: Mapping[str, Any]) -> str:
    """The mean, then the per-run values when the arm ran more than once (V8)."""
    if metric.needs_policy and arm["policy_registered"] is False:
        return "n/a (no policy)"
    runs = arm["runs"]
    if metric.key == "invented":
        return _invented_cell(runs)
    mean = arm["mean"].get(metric.key)
    text = _fmt(mean, metric.decimals)
    if metric.out_of is not None and mean is not None:
        text += f"/{_fmt(arm['mean'].get(metric.out_of), 0)}"
    if len(runs) > 1:
        text += " (" + ", ".join(_fmt(_value(r, metric.key), metric.decimals) for r in runs) + ")"
    return text


def _invented_cell(runs: Sequence[Mapping[str, Any]]) -> str:
    """V4/V5: invented grounding is 0 only where someone read the answers."""
    parts = []
    for run in runs:
        if run["invented"] is None:
            parts.append("not checked")
        elif run["invented_checked"] < run["questions"]:
            parts.append(f"{run['invented']} ({run['invented_checked']}/{run['questions']} checked)")
        else:
            parts.append(str(run["invented"]))
    distinct = list(dict.fromkeys(parts))
    return distinct[0] if len(distinct) == 1 else ", ".join(parts)


def _difference(metric: Metric, first: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    if metric.needs_policy and False in (first["policy_registered"], other["policy_registered"]):
        return "n/a"
    if metric.key == "invented" and any(r["invented"] is None for r in (*first["runs"], *other["runs"])):
        return "n/a"
    a, b = first["mean"].get(metric.key), other["mean"].get(metric.key)
    if a is None or b is None:
        return "–"
    delta = b - a
    text = _fmt(abs(delta), metric.decimals)
    return "0" if delta == 0 else ("+" if delta > 0 else "−") + text


def _table(arms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "metric": m.key,
            "label": m.label,
            "values": {arm["name"]: _cell(m, arm) for arm in arms},
            "differences": {f"{arm['name']} − {arms[0]['name']}": _difference(m, arms[0], arm) for arm in arms[1:]},
        }
        for m in METRICS
    ]


def _questions(arms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per question, in the first arm's order, with every arm's answer per run."""
    order: dict[str, dict[str, Any]] = {}
    for arm in arms:
        for run in arm["runs"]:
            for row in run["rows"]:
                order.setdefault(row["custom_id"], {
                    "custom_id": row["custom_id"],
                    "question": row["question"],
                    "answerable": row["answerable"],
                    "reference_answer": row["reference_answer"],
                    "arms": {a["name"]: [None] * len(a["runs"]) for a in arms},
                })
    for arm in arms:
        for index, run in enumerate(arm["runs"]):
            for row in run["rows"]:
                order[row["custom_id"]]["arms"][arm["name"]][index] = row
    return list(order.values())


# --- HTML ---------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ddd;padding:.3em .6em;vertical-align:top}
th{background:#f4f4f4;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
.grounded{color:#2e7d32}.ungrounded{color:#a86b00}.missing{color:#c62828}.muted{color:#777}
.badge{display:inline-block;padding:0 .4em;border-radius:3px;font-size:.85em;background:#eee;margin:0 .1em}
.answer{border:1px solid #ddd;border-radius:4px;padding:.6em 1em;margin:.8em 0}
.answer pre,.cite pre{white-space:pre-wrap;margin:.3em 0;font:inherit}.cite{margin-left:1.5em;border-left:3px solid #ccc;
padding-left:.8em}.charts{display:flex;flex-wrap:wrap;gap:2em}.charts svg{max-width:100%;height:auto}
.notes{background:#fff8e1;padding:.5em 1em;border-radius:4px}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _label(answerable: bool | None) -> str:
    return {True: "answerable", False: "unanswerable", None: "unlabelled"}[answerable]


def answer_anchor(qi: int, ai: int, ri: int) -> str:
    return f"a-{qi}-{ai}-{ri}"


def citation_anchor(qi: int, ai: int, ri: int, ci: int) -> str:
    return f"c-{qi}-{ai}-{ri}-{ci}"


def _seed_table(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    diffs = [f"{arm['name']} − {arms[0]['name']}" for arm in arms[1:]]
    head = "".join(f"<th>{_e(a['name'])}</th>" for a in arms) + "".join(f"<th>{_e(d)}</th>" for d in diffs)
    rows = []
    for row in report["table"]:
        cells = "".join(f"<td class=num>{_e(row['values'][a['name']])}</td>" for a in arms)
        cells += "".join(f"<td class=num>{_e(row['differences'][d])}</td>" for d in diffs)
        rows.append(f"<tr><td>{_e(row['label'])}</td>{cells}</tr>")
    return f"<table id=metrics><tr><th>metric</th>{head}</tr>{''.join(rows)}</table>"


def _marks(row: Mapping[str, Any]) -> str:
    marks = []
    if row["refusal"]:
        marks.append("refusal")
    if row["correct"] is True:
        marks.append("correct")
    elif row["correct"] is False:
        marks.append("incorrect")
    if row["redirects"]:
        marks.append(f"redirect×{row['redirects']}")
    if row["violation"]:
        marks.append("violation")
    if row["invented"]:
        marks.append("invented")
    return "".join(f"<span class=badge>{_e(m)}</span>" for m in marks)


def _question_table(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    head = "".join(f"<th>{_e(a['name'])}</th>" for a in arms)
    rows = []
    for qi, q in enumerate(report["questions"]):
        cells = []
        for ai, arm in enumerate(arms):
            entries = []
            for ri, row in enumerate(q["arms"][arm["name"]]):
                if row is None:
                    entries.append("<span class=muted>failed or absent</span>")
                    continue
                cites = "".join(
                    f" <a href='#{citation_anchor(qi, ai, ri, ci)}' title='{_e(c['chunk_id'])}: "
                    f"{_e(c.get('document_title') or '')}'>[{ci + 1}]</a>"
                    for ci, c in enumerate(row["cited"])
                )
                run = f"<span class=muted>run {ri + 1}:</span> " if len(arm["runs"]) > 1 else ""
                entries.append(
                    f"{run}<a class={row['status']} href='#{answer_anchor(qi, ai, ri)}'>{row['status']}</a>"
                    f"{_marks(row)}{cites}"
                )
            cells.append("<td>" + "<br>".join(entries) + "</td>")
        rows.append(
            f"<tr id=q-{qi}><td>{qi + 1}</td><td>{_e(q['custom_id'])}</td><td>{_label(q['answerable'])}</td>"
            f"<td>{_e(q['question'])}</td>{''.join(cells)}</tr>"
        )
    return (
        f"<table id=questions><tr><th>#</th><th>id</th><th>label</th><th>question</th>{head}</tr>"
        f"{''.join(rows)}</table>"
    )


def _answers(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    out = []
    for qi, q in enumerate(report["questions"]):
        out.append(f"<h3>{qi + 1}. {_e(q['question'])} <span class=muted>({_e(q['custom_id'])}, "
                   f"{_label(q['answerable'])})</span> <a href='#q-{qi}'>↑</a></h3>")
        if q["reference_answer"]:
            out.append(f"<p><b>Reference answer:</b> {_e(q['reference_answer'])}</p>")
        for ai, arm in enumerate(arms):
            for ri, row in enumerate(q["arms"][arm["name"]]):
                if row is None:
                    continue
                run = f" run {ri + 1}" if len(arm["runs"]) > 1 else ""
                cites = "".join(
                    f"<div class=cite id={citation_anchor(qi, ai, ri, ci)}><b>[{ci + 1}]</b> "
                    f"{_e(c.get('document_title') or '')} <span class=muted>{_e(c.get('document_uri') or '')} "
                    f"(chunk {_e(c['chunk_id'])}, {_e(c['capability'])}{'' if c.get('retrieved_this_question') else ', not retrieved this question'})"
                    f"</span><pre>{_e(c.get('content') or '')}</pre></div>"
                    for ci, c in enumerate(row["cited"])
                )
                out.append(
                    f"<div class=answer id={answer_anchor(qi, ai, ri)}><b>{_e(arm['name'])}{run}</b>: "
                    f"<span class={row['status']}>{row['status']}</span>{_marks(row)} "
                    f"<span class=muted>{row['n_requests']} requests · job {_e(row['job_id'])}"
                    f"{' · judge: ' + _e(row['judge_reason']) if row['judge_reason'] else ''}</span>"
                    f"<pre>{_e(row['answer'])}</pre>{cites}</div>"
                )
    return "".join(out)


def render_html(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    policy = {True: "policy registered", False: "policy not registered"}
    meta = "".join(
        f"<li><b>{_e(a['name'])}</b>: model {_e(a['model'])}, "
        f"{policy.get(a['policy_registered'], 'policy registration mixed')}, "
        f"{len(a['runs'])} run(s), batches {_e(', '.join(a['batches']) or '–')}</li>"
        for a in arms
    )
    notes = "".join(f"<li>{_e(n)}</li>" for n in report["notes"])
    failed = [(a["name"], j) for a in arms for run in a["runs"] for j in run["failed_jobs"]]
    failures = "".join(
        f"<li>{_e(name)}: {_e(j['custom_id'])} ({_e(j['job_id'])}): "
        f"{_e((j['error'] or {}).get('type'))}: {_e((j['error'] or {}).get('message'))}</li>"
        for name, j in failed
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>Evaluation: {_e(' vs '.join(a['name'] for a in arms))}</title><style>{_CSS}</style></head><body>"
        f"<h1>Evaluation: {_e(' vs '.join(a['name'] for a in arms))}</h1>"
        f"<p class=muted>Generated {_e(report['generated_at'])}. Judge: {_e(report['judge'])}.</p>"
        f"<ul>{meta}</ul>"
        + (f"<div class=notes><b>Notes</b><ul>{notes}</ul></div>" if notes else "")
        + "<h2>Metrics</h2><p class=muted>Means over runs; per-run values in brackets when an arm ran more "
        "than once. Invented grounding counts only answers a reviewer read.</p>"
        + _seed_table(report)
        + (f"<h2>Failed jobs</h2><ul>{failures}</ul>" if failures else "")
        + f"<h2>Charts</h2><div class=charts><figure>{status_chart(arms)}</figure>"
        f"<figure>{behaviour_chart(arms)}</figure></div>"
        + "<h2>Per question</h2>" + _question_table(report)
        + "<h2>Answers and citations</h2>" + _answers(report)
        + "</body></html>"
    )
