"""The evaluation report: arms side by side, per-run values and means (V8), rendered offline."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

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
    return next(r for r in report["table"] if r["metric"] == key)


def test_V8_report_gives_per_run_values_and_their_mean():
    report = off_on_report()
    on = report["arms"][1]
    assert [run["ungrounded_declarations"] for run in on["runs"]] == [1, 0]
    assert on["mean"]["ungrounded_declarations"] == pytest.approx(0.5)
    assert row(report, "ungrounded_declarations")["values"] == {"off": "1", "on": "0.50 (1, 0)"}
    assert row(report, "grounded_unanswerable")["values"]["on"] == "1.50/3 (1, 2)"
    assert row(report, "grounded_unanswerable")["differences"] == {"on − off": "+0.50"}
    assert row(report, "answerable_answered")["values"] == {"off": "1/1", "on": "1/1 (1, 1)"}


def test_V5_violations_are_not_applicable_without_the_policy_and_invented_not_checked():
    report = off_on_report()
    assert row(report, "violations")["values"]["off"] == "n/a (no policy)"
    assert row(report, "violations")["differences"] == {"on − off": "n/a"}
    assert row(report, "invented")["values"] == {"off": "not checked", "on": "not checked"}
    assert row(report, "failed")["values"] == {"off": "1", "on": "1 (1, 1)"}


def test_V4_report_names_its_judge():
    report = off_on_report()
    assert report["judge"].startswith("rule-based judge")
    assert html.escape(report["judge"]) in render_html(report)


def test_report_lists_every_question_with_each_arms_answers_per_run():
    report = off_on_report()
    ids = [q["custom_id"] for q in report["questions"]]
    assert ids == ["u1", "u2", "u3", "a1"]
    u1 = report["questions"][0]
    assert [r["status"] for r in u1["arms"]["on"]] == ["ungrounded", "grounded"]
    assert len(u1["arms"]["off"]) == 1
    json.dumps(report)  # report.json is plain JSON


def test_report_html_holds_the_table_charts_and_anchors_for_answers_and_citations():
    report = off_on_report()
    page = render_html(report)
    assert "<table id=metrics>" in page and "Explicit ungrounded declarations" in page
    assert page.count("<svg") == 2 and "Citation status by arm" in page
    assert "<table id=questions>" in page
    qi = next(i for i, q in enumerate(report["questions"]) if q["custom_id"] == "a1")
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
