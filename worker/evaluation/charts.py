"""The report's two bar charts, laid out here and drawn as inline SVG by `templates/chart.svg.j2`.

Plain SVG needs no plotting library in every worker image, opens offline, and stays readable
without the picture: each chart has a title and a description, its axes are labelled, and every
bar carries its value as text. A chart whose values are all zero says so in words instead of
drawing empty axes, since "none in any arm" is the result a reader is looking for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .models import ArmReport

# Citation status by what it is, not by whether it is good: grounded is the right outcome only on
# answerable questions (V9), so it is not drawn in the "good" green.
STATUS_COLOURS = {"grounded": "#1565c0", "ungrounded": "#f9a825", "missing": "#c62828"}
BEHAVIOUR_COLOURS = {"redirects": "#00838f", "violations": "#6a1b9a", "undeclared": "#c62828"}

BAR, GAP = 22.0, 26.0  # bar width, and the space between two groups of bars
LEFT, RIGHT, TOP, BOTTOM = 56.0, 130.0, 40.0, 52.0  # room for the y axis, legend, title, group labels
PLOT_HEIGHT = 170.0
LINE = 14.0  # the height of one line of text


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    height: float
    colour: str
    series: str
    value: str  # the number as text, written above the bar


@dataclass(frozen=True)
class Group:
    x: float  # the centre of the group's bars
    lines: tuple[str, ...]  # its label, one entry per line


@dataclass(frozen=True)
class Tick:
    y: float
    text: str


@dataclass(frozen=True)
class Chart:
    id: str  # prefix of the SVG's element ids, distinct per chart on one page
    title: str
    description: str  # what a screen reader says for the picture: every value, in words
    y_label: str
    width: float
    height: float
    bars: tuple[Bar, ...]
    groups: tuple[Group, ...]
    ticks: tuple[Tick, ...]
    legend: tuple[tuple[str, str], ...]  # (colour, series name)
    empty: str | None = None  # said instead of the axes when every value is zero
    bar_width: float = BAR

    @property
    def plot_left(self) -> float:
        return LEFT

    @property
    def plot_right(self) -> float:
        return self.width - RIGHT

    @property
    def plot_top(self) -> float:
        return TOP

    @property
    def plot_bottom(self) -> float:
        return TOP + PLOT_HEIGHT


def value_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _step(highest: float) -> float:
    """A round tick interval (1, 2 or 5 times a power of ten) giving at most five intervals."""
    power = 10 ** math.floor(math.log10(highest / 5)) if highest > 5 else 1.0
    return next(f * power for f in (1, 2, 5, 10) if highest / (f * power) <= 5)


def grouped_bars(
    chart_id: str,
    title: str,
    y_label: str,
    series: dict[str, str],
    groups: Sequence[tuple[tuple[str, ...], Sequence[float]]],
    *,
    empty: str,
) -> Chart:
    """Pure layout: a group of bars per label, a bar per series (`name -> colour`), on one y axis."""
    width = LEFT + len(groups) * (len(series) * BAR + GAP) + RIGHT
    summary = "; ".join(
        f"{' '.join(lines)}: " + ", ".join(f"{name} {value_text(v)}" for name, v in zip(series, values, strict=True))
        for lines, values in groups
    )
    legend = tuple((colour, name) for name, colour in series.items())
    highest = max((v for _, values in groups for v in values), default=0.0)
    if highest <= 0:
        return Chart(chart_id, title, f"{empty} ({summary})" if summary else empty, y_label, width,
                     TOP + PLOT_HEIGHT / 2, (), (), (), legend, empty=empty)
    step = _step(highest)
    top = step * math.ceil(highest / step)
    scale = PLOT_HEIGHT / top
    bottom = TOP + PLOT_HEIGHT
    bars, labels = [], []
    for index, (lines, values) in enumerate(groups):
        start = LEFT + GAP / 2 + index * (len(series) * BAR + GAP)
        labels.append(Group(start + len(series) * BAR / 2, lines))
        for offset, ((name, colour), value) in enumerate(zip(series.items(), values, strict=True)):
            height = value * scale
            bars.append(Bar(round(start + offset * BAR, 1), round(bottom - height, 1), round(height, 1), colour, name,
                            value_text(value)))
    ticks = tuple(Tick(round(bottom - i * step * scale, 1), value_text(i * step)) for i in range(round(top / step) + 1))
    return Chart(chart_id, title, summary, y_label, width, TOP + PLOT_HEIGHT + BOTTOM, tuple(bars), tuple(labels),
                 ticks, legend)


def status_chart(arms: Sequence[ArmReport]) -> Chart:
    """Citation status per arm, answerable and unanswerable questions side by side (means over runs)."""
    groups = []
    for arm in arms:
        splits = (("answerable", arm.mean.status.answerable), ("unanswerable", arm.mean.status.unanswerable))
        for split, counts in splits:
            groups.append(((arm.name, split), (counts.grounded, counts.ungrounded, counts.missing)))
    return grouped_bars("status", "Citation status by arm", "questions", STATUS_COLOURS, groups,
                        empty="No evaluated answers in any arm")


def behaviour_chart(arms: Sequence[ArmReport]) -> Chart:
    """Redirects fired, violations and undeclared answers per arm (means over runs)."""
    groups = [((arm.name,), (arm.mean.redirects, arm.mean.violations, arm.mean.undeclared)) for arm in arms]
    return grouped_bars("behaviour", "Redirects, violations and undeclared answers", "questions",
                        BEHAVIOUR_COLOURS, groups, empty="No redirects, violations or undeclared answers in any arm")
