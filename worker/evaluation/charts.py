"""The report's charts, drawn with matplotlib into inline SVG so the report opens offline.

`Figure` is used directly rather than pyplot: pyplot keeps global state, and the API renders
reports on worker threads.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
from matplotlib.figure import Figure

STATUS_COLOURS = {"grounded": "#2e7d32", "ungrounded": "#f9a825", "missing": "#c62828"}
BEHAVIOUR_COLOURS = {"redirects": "#1565c0", "violations": "#6a1b9a", "undeclared": "#c62828"}


def _svg(figure: Figure, salt: str) -> str:
    """SVG text without its XML prologue, ready to sit inside HTML. The salt keeps the element ids of
    two charts on one page apart, and makes the output repeatable."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = re.sub(r"^.*?(?=<svg)", "", buffer.getvalue(), count=1, flags=re.DOTALL)
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.DOTALL)


def status_chart(arms: Sequence[Mapping[str, Any]]) -> str:
    """Citation status per arm, answerable and unanswerable questions side by side (means over runs)."""
    labels: list[str] = []
    stacks: dict[str, list[float]] = {s: [] for s in STATUS_COLOURS}
    for arm in arms:
        for split in ("answerable", "unanswerable"):
            labels.append(f"{arm['name']}\n{split}")
            for status in STATUS_COLOURS:
                stacks[status].append(arm["mean"].get(f"status.{split}.{status}") or 0.0)
    figure = Figure(figsize=(max(4.0, 1.3 * len(labels) + 1.5), 3.4))
    ax = figure.subplots()
    bottom = [0.0] * len(labels)
    for status, colour in STATUS_COLOURS.items():
        ax.bar(labels, stacks[status], bottom=bottom, color=colour, label=status, width=0.6)
        bottom = [b + v for b, v in zip(bottom, stacks[status], strict=True)]
    ax.set_ylabel("questions")
    ax.set_title("Citation status by arm")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _svg(figure, "status")


def behaviour_chart(arms: Sequence[Mapping[str, Any]]) -> str:
    """Redirects fired, violations and undeclared answers per arm (means over runs)."""
    keys = list(BEHAVIOUR_COLOURS)
    highest = max((arm["mean"].get(key) or 0.0 for arm in arms for key in keys), default=0.0)
    width = 0.8 / len(keys)
    figure = Figure(figsize=(max(4.0, 1.6 * len(arms) + 2.0), 3.4))
    ax = figure.subplots()
    positions = list(range(len(arms)))
    for i, key in enumerate(keys):
        values = [arm["mean"].get(key) or 0.0 for arm in arms]
        ax.bar([p + (i - (len(keys) - 1) / 2) * width for p in positions], values, width=width,
               color=BEHAVIOUR_COLOURS[key], label=key)
    ax.set_xticks(positions, [arm["name"] for arm in arms])
    ax.set_ylim(0, max(1.0, highest * 1.15))  # all zeros is the expected result, drawn as such
    ax.set_ylabel("questions")
    ax.set_title("Redirects, violations and undeclared answers")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _svg(figure, "behaviour")
