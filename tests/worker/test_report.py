"""The evaluation report: arms side by side, per-run values and means (V8), rendered offline."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from markupsafe import escape

from tests.conftest import REPO
from tests.harness import SIGNER
from tests.worker.stored_results import stored, synthetic_arm, synthetic_off_arm
from worker.evaluation.report import ArmRuns, answer_anchor, build_report, citation_anchor, render_html

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def off_on_report(**kwargs):
    off = synthetic_off_arm("off-1")
    on_runs = [synthetic_arm("on-1"), synthetic_arm("on-2")]
    on_runs[1][0] = stored("u1", answerable=False, status="grounded", answer="It listens on port 8080.",
                           batch_id="on-2")
    arms = [ArmRuns("off", [off], ["off-1"]), ArmRuns("on", on_runs, ["on-1", "on-2"])]
    return build_report(arms, signer=SIGNER, **kwargs)


def row(report, key):
    return next(r for r in report.table if r.metric == key)


def test_V8_report_gives_per_run_values_and_their_mean():
    report = off_on_report()
    on = report.arms[1]
    assert [run.ungrounded_declarations for run in on.runs] == [1, 0]
    assert on.mean.ungrounded_declarations == pytest.approx(0.5)
    assert row(report, "ungrounded_declarations").values == {"off": "1", "on": "0.50 (1, 0)"}
    assert row(report, "grounded_unanswerable").values["on"] == "1.50/3 (1, 2)"
    assert row(report, "grounded_unanswerable").differences == {"on − off": "+0.50"}
    assert row(report, "answerable_answered").values == {"off": "1/1", "on": "1/1 (1, 1)"}


def test_V5_violations_are_not_applicable_without_the_policy_and_invented_not_checked():
    report = off_on_report()
    assert row(report, "violations").values["off"] == "n/a (no policy)"
    assert row(report, "violations").differences == {"on − off": "n/a"}
    assert row(report, "invented").values == {"off": "not checked", "on": "not checked"}
    assert row(report, "failed").values == {"off": "1", "on": "1 (1, 1)"}


def test_V4_report_names_its_judge():
    report = off_on_report()
    assert report.judge.startswith("rule-based judge")
    assert escape(report.judge) in render_html(report)


def test_report_lists_every_question_with_each_arms_answers_per_run():
    report = off_on_report()
    ids = [q.custom_id for q in report.questions]
    assert ids == ["u1", "u2", "u3", "a1"]
    u1 = report.questions[0]
    assert [r.status for r in u1.arms["on"]] == ["ungrounded", "grounded"]
    assert len(u1.arms["off"]) == 1
    json.loads(report.model_dump_json())  # report.json is plain JSON


def test_report_html_holds_the_table_charts_and_anchors_for_answers_and_citations():
    report = off_on_report()
    page = render_html(report)
    assert "<table id=metrics>" in page and "Explicit ungrounded declarations" in page
    assert page.count("<svg") == 2 and "Citation status by arm" in page
    assert "<table id=questions>" in page
    qi = next(i for i, q in enumerate(report.questions) if q.custom_id == "a1")
    assert f"href='#{answer_anchor(qi, 1, 1)}'" in page and f"id={answer_anchor(qi, 1, 1)}" in page
    assert f"href='#{citation_anchor(qi, 1, 0, 0)}'" in page and f"id={citation_anchor(qi, 1, 0, 0)}" in page
    assert "The service listens on port 8080 by default." in page
    assert not re.search(r"""(src=|<link|url\((?!#)|href=["']?https?:)""", page)  # nothing to fetch: opens offline


def test_report_html_escapes_answers():
    arm = [stored("x1", answerable=False, status="ungrounded", answer="<script>alert(1)</script>")]
    page = render_html(build_report([ArmRuns("on", [arm])], signer=SIGNER))
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def chromium() -> str | None:
    return next((p for p in CHROMIUM_CANDIDATES if Path(p).exists()), shutil.which("chromium"))


def screenshot(page: Path, png: Path) -> subprocess.CompletedProcess[str]:
    browser = chromium()
    if browser is None:
        pytest.skip("no headless browser: /usr/bin/chromium is not installed (apt-get install chromium)")
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2000",
         f"--user-data-dir={png.parent / 'chromium-profile'}", f"--screenshot={png}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )


def assert_not_blank(png: Path) -> None:
    from PIL import Image, ImageStat

    with Image.open(png) as image:
        grey = image.convert("L")
        extrema = grey.getextrema()
        stddev = ImageStat.Stat(grey).stddev[0]
    assert extrema[0] < 100 and extrema[1] > 200, f"screenshot looks blank: grey range {extrema}"
    assert stddev > 5, f"screenshot looks blank: grey stddev {stddev:.1f}"


def test_report_opens_in_a_headless_browser(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(off_on_report()))
    png = tmp_path / "report.png"
    run = screenshot(page, png)
    assert run.returncode == 0, run.stderr[-2000:]
    assert png.exists(), run.stderr[-2000:]
    assert_not_blank(png)


SCRIPT = "<script>alert(1)</script>"


def test_report_html_escapes_model_corpus_and_caller_text_everywhere():
    """Answers come from models, cited chunks from corpora, arm names and questions from callers: none of
    them may put markup on the page, in the tables, the answers or the SVG charts."""
    result = stored("x1", answerable=False, status="grounded", answer=f"{SCRIPT} port 8080")
    turn = result.turns[0]
    cited = turn.cited[0].model_copy(update={"content": f"chunk {SCRIPT}", "document_title": f"title {SCRIPT}",
                                             "document_uri": f"{SCRIPT}.md"})
    turn = turn.model_copy(update={"question_text": f"question {SCRIPT}?", "cited": [cited]})
    result = result.model_copy(update={"turns": [turn], "custom_id": f"id-{SCRIPT}"})
    page = render_html(build_report([ArmRuns(f"arm {SCRIPT}", [[result]], [f"batch-{SCRIPT}"])], signer=SIGNER,
                                    notes=[f"note {SCRIPT}"]))
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 10
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.DOTALL)
    assert len(svgs) == 2 and all("arm &lt;script&gt;" in svg for svg in svgs)


def test_charts_are_svg_with_a_title_axis_labels_and_every_value_as_text():
    page = render_html(off_on_report())
    status, behaviour = re.findall(r"<svg.*?</svg>", page, flags=re.DOTALL)
    assert 'role="img"' in status and "<title id=\"status-title\">Citation status by arm</title>" in status
    assert ">questions</text>" in status and "<tspan" in status and ">unanswerable</tspan>" in status
    assert ">1.50</text>" in status  # the on arm's mean of grounded answers to unanswerable questions
    assert "on unanswerable: grounded 1.50, ungrounded 0.50, missing 1" in status  # the description says it all
    assert "<title>redirects: 1</title>" in behaviour and "No redirects" not in behaviour


def test_an_all_zero_chart_says_so_instead_of_drawing_empty_axes():
    quiet = [stored("q1", answerable=True, status="grounded"), stored("q2", answerable=False, status="ungrounded")]
    page = render_html(build_report([ArmRuns("on", [quiet])], signer=SIGNER))
    _, behaviour = re.findall(r"<svg.*?</svg>", page, flags=re.DOTALL)
    assert "No redirects, violations or undeclared answers in any arm" in behaviour
    assert "<rect" not in behaviour and "<line" not in behaviour


def test_V9_grounded_is_coloured_as_right_only_on_answerable_questions():
    arm = [stored("u1", answerable=False, status="grounded"), stored("a1", answerable=True, status="grounded"),
           stored("u2", answerable=False, status="ungrounded"), stored("n1", answerable=None, status="grounded")]
    report = build_report([ArmRuns("on", [arm])], signer=SIGNER)
    outcomes = {q.custom_id: q.arms["on"][0].outcome for q in report.questions}
    assert outcomes == {"u1": "wrong", "a1": "right", "u2": "right", "n1": "unlabelled"}
    page = render_html(report)
    anchors = {answer_anchor(i, 0, 0): q.custom_id for i, q in enumerate(report.questions)}
    shown = dict(re.findall(r"<a class=\"status (\w+)\" href='#([\w-]+)'>grounded</a>", page))
    assert {anchors[a]: o for o, a in shown.items()} == {"u1": "wrong", "a1": "right", "n1": "unlabelled"}
    status_chart = re.findall(r"<svg.*?</svg>", page, flags=re.DOTALL)[0]
    assert "#2e7d32" not in status_chart  # the chart's grounded bars are not the page's "right" green


def test_report_json_holds_the_means_as_typed_as_the_runs(tmp_path):
    from worker.evaluation.experiment import write_report

    json_path, _ = write_report(off_on_report(), tmp_path)
    on = json.loads(json_path.read_text())["arms"][1]
    assert on["mean"]["status"]["unanswerable"]["grounded"] == pytest.approx(1.5)
    assert on["mean"]["refusal"]["recall"] == pytest.approx(1 / 6)
    assert set(on["mean"]) <= set(on["runs"][0])  # a mean for each number a run has, under the same name


def test_rendering_a_report_needs_no_plotting_library():
    probe = ("import sys; from tests.worker.test_report import off_on_report; "
             "from worker.evaluation.report import render_html; render_html(off_on_report()); "
             "print(sorted(m for m in ('matplotlib', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_report_templates_are_declared_as_package_data():
    """The templates are not Python modules, so an installed package has them only if pyproject says so."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = REPO / "worker" / "evaluation"
    templates = [p.relative_to(package).as_posix() for p in (package / "templates").iterdir() if p.is_file()]
    assert templates and all(any(fnmatch(t, g) for g in declared["worker.evaluation"]) for t in templates)
