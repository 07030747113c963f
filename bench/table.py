"""Rows and the table every benchmark reports in.

A row is a plain dict, `{name, measured, unit, goal, ratio, status}` (the shape `bench.search`
already returns), plus `better` ("lower" or "higher") for goals that are floors, and an optional
`note`. `ratio` is measured / goal; whether 1.00 passes from below or above is `better`'s business.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

Better = Literal["lower", "higher"]


def row(
    name: str,
    measured: float,
    unit: str,
    goal: float | None = None,
    *,
    better: Better = "lower",
    note: str | None = None,
    digits: int = 3,
) -> dict[str, Any]:
    ratio = None if goal is None else measured / goal
    if ratio is None:
        status = "info"
    elif better == "lower":
        status = "pass" if ratio <= 1.0 else "short"
    else:
        status = "pass" if ratio >= 1.0 else "short"
    out: dict[str, Any] = {
        "name": name,
        "measured": round(measured, digits),
        "unit": unit,
        "goal": goal,
        "ratio": None if ratio is None else round(ratio, 3),
        "status": status,
        "better": better,
    }
    if note:
        out["note"] = note
    return out


def failed_row(name: str, why: str) -> dict[str, Any]:
    """A benchmark that could not measure still takes its line, so a short run is visible."""
    return {"name": name, "measured": None, "unit": "", "goal": None, "ratio": None, "status": "error",
            "better": "lower", "note": why}


def _number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def _with_unit(value: float, unit: str) -> str:
    if unit in ("×", "%"):
        return f"{_number(value)}{unit}"
    return f"{_number(value)} {unit}".rstrip()


def goal_text(r: dict[str, Any]) -> str:
    if r.get("goal") is None:
        return ""
    sign = "≥" if r.get("better") == "higher" else "≤"
    return f"{sign} {_with_unit(r['goal'], r['unit'])}"


def measured_text(r: dict[str, Any]) -> str:
    return "—" if r.get("measured") is None else _with_unit(r["measured"], r["unit"])


def markdown_table(rows: Sequence[dict[str, Any]], *, notes: bool = True) -> str:
    lines = ["| benchmark | goal | measured | ratio | status |", "|---|---:|---:|---:|---|"]
    for r in rows:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        status = r["status"] if not (notes and r.get("note")) else f"{r['status']} ({r['note']})"
        lines.append(f"| {r['name']} | {goal_text(r)} | {measured_text(r)} | {ratio} | {status} |")
    return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def print_run(run: Callable[[], Sequence[dict[str, Any]]]) -> None:
    """Run one benchmark module on its own (`python -m bench.NAME`) and print its rows."""
    start = time.perf_counter()
    print(markdown_table(run()))
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
