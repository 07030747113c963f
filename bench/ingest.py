"""Ingest throughput: PDF pages/s with and without page images, and Markdown and text MB/s.

The corpus is written here, with real writers: 10 PDFs of 50 A4 pages each (reportlab; a
heading and an outline entry per page, about 450 words of wrapped text in paragraphs, a drawn
picture on every tenth page), and Markdown and plain-text files of the same Zipf-distributed
words (bench.search's vocabulary), 1.5 MB of each. Every number is one `ingest()` call into
a fresh corpus file, as `grounded ingest` makes it: one process, one thread, so wall-clock pages/s
is one core's (the CPU-time rate is given beside it, since other load on a shared machine slows
the wall clock but not the CPU time). Rounds alternate the two PDF modes; medians.

Run: `.venv/bin/python -m bench.ingest`.
"""

from __future__ import annotations

import io
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.search import vocabulary
from bench.table import print_run, row
from capabilities.corpus import ReadOptions, ingest

PDF_FILES = 10
PAGES_PER_PDF = 50
PDF_PAGES = PDF_FILES * PAGES_PER_PDF
WORDS_PER_PAGE = 450
TEXT_FILES = 60
TEXT_BYTES_PER_FILE = 50_000
ROUNDS = 2
GOAL_PAGES_PER_S = 20.0
"""With page images, on one core (issue 14)."""
SEED = 20_261_202


def _sentences(rng: random.Random, words: Sequence[str], weights: Sequence[float], count: int) -> list[str]:
    out = []
    for _ in range(count):
        sentence = rng.choices(words, cum_weights=weights, k=rng.randint(8, 22))
        out.append(" ".join(sentence).capitalize() + ".")
    return out


def write_pdf(path: Path, rng: random.Random, words: Sequence[str], weights: Sequence[float]) -> None:
    from PIL import Image
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    picture = io.BytesIO()
    Image.new("RGB", (200, 120), (30, 90, 160)).save(picture, "PNG")
    pdf = canvas.Canvas(str(path), pagesize=A4)
    width, height = A4
    for number in range(1, PAGES_PER_PDF + 1):
        heading = " ".join(rng.choices(words, cum_weights=weights, k=3)).title()
        pdf.bookmarkPage(f"p{number}")
        pdf.addOutlineEntry(heading, f"p{number}", level=0)
        pdf.setFont("Helvetica-Bold", 15)
        pdf.drawString(60, height - 60, heading)
        text = pdf.beginText(60, height - 90)
        text.setFont("Helvetica", 10)
        line, written = "", 0
        for sentence in _sentences(rng, words, weights, 40):
            for word in sentence.split():
                if len(line) + len(word) > 95:
                    text.textLine(line)
                    line = ""
                line = f"{line} {word}".strip()
                written += 1
            if rng.random() < 0.25:
                text.textLine(line)
                text.textLine("")
                line = ""
            if written >= WORDS_PER_PAGE:
                break
        text.textLine(line)
        pdf.drawText(text)
        if number % 10 == 0:
            pdf.drawImage(ImageReader(io.BytesIO(picture.getvalue())), 60, 60, width=200, height=120)
        pdf.showPage()
    pdf.save()


def write_text(folder: Path, suffix: str, rng: random.Random, words: Sequence[str], weights: Sequence[float]) -> int:
    total = 0
    for number in range(TEXT_FILES // 2):
        parts: list[str] = []
        size = 0
        section = 0
        while size < TEXT_BYTES_PER_FILE:
            if suffix == ".md" and size >= section * 4000:
                section += 1
                parts.append(f"## {' '.join(rng.choices(words, cum_weights=weights, k=3)).title()}")
            paragraph = " ".join(_sentences(rng, words, weights, rng.randint(2, 6)))
            parts.append(paragraph)
            size += len(paragraph) + 2
        body = "\n\n".join(parts) + "\n"
        if suffix == ".md":
            body = f"# Document {number}\n\n{body}"
        path = folder / f"doc-{number:03}{suffix}"
        path.write_text(body)
        total += path.stat().st_size
    return total


def timed(call: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def run() -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    words, weights = vocabulary(rng)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = Path(tmp)
        pdfs, markdown, text = root / "pdf", root / "markdown", root / "text"
        for folder in (pdfs, markdown, text):
            folder.mkdir()
        for number in range(PDF_FILES):
            write_pdf(pdfs / f"manual-{number:02}.pdf", rng, words, weights)
        markdown_bytes = write_text(markdown, ".md", rng, words, weights)
        text_bytes = write_text(text, ".txt", rng, words, weights)

        runs: dict[str, list[tuple[float, float]]] = {"images": [], "text": [], "unchanged": [], "md": [], "txt": []}
        sizes: list[int] = []
        for round_number in range(ROUNDS):
            order = [True, False] if round_number % 2 == 0 else [False, True]
            for images in order:
                db = root / f"pdf-{round_number}-{int(images)}.sqlite"
                report_holder: list[Any] = []
                runs["images" if images else "text"].append(timed(lambda: report_holder.append(
                    ingest(db, [pdfs], options=ReadOptions(page_images=images)))))
                assert len(report_holder[0].added) == PDF_FILES, report_holder[0].summary()
                if images:
                    sizes.append(db.stat().st_size)
                    runs["unchanged"].append(timed(lambda: ingest(db, [pdfs])))
            for kind, folder in (("md", markdown), ("txt", text)):
                runs[kind].append(timed(lambda: ingest(root / f"{kind}-{round_number}.sqlite", [folder])))

    def rate(kind: str, amount: float) -> tuple[float, float]:
        wall = statistics.median(w for w, _ in runs[kind])
        cpu = statistics.median(c for _, c in runs[kind])
        return amount / wall, amount / cpu

    images_wall, images_cpu = rate("images", PDF_PAGES)
    text_wall, text_cpu = rate("text", PDF_PAGES)
    unchanged_wall, _ = rate("unchanged", PDF_PAGES)
    md_wall, md_cpu = rate("md", markdown_bytes / 1e6)
    txt_wall, txt_cpu = rate("txt", text_bytes / 1e6)
    kb_per_page = statistics.median(sizes) / PDF_PAGES / 1024
    return [
        row(f"ingest: PDF with page images, {PDF_PAGES} pages, one core", images_wall, "pages/s", GOAL_PAGES_PER_S,
            better="higher", note=f"{images_cpu:.0f} pages per CPU second; {kb_per_page:.0f} KB of corpus a page"),
        row("↳ PDF text only (--no-page-images)", text_wall, "pages/s",
            note=f"{text_cpu:.0f} pages per CPU second"),
        row("↳ PDF re-ingest, every file unchanged", unchanged_wall, "pages/s",
            note="recognised from the file's hash before parsing"),
        row(f"ingest: Markdown, {markdown_bytes / 1e6:.1f} MB in {TEXT_FILES // 2} files", md_wall, "MB/s",
            note=f"{md_cpu:.2f} MB per CPU second"),
        row(f"ingest: plain text, {text_bytes / 1e6:.1f} MB in {TEXT_FILES // 2} files", txt_wall, "MB/s",
            note=f"{txt_cpu:.2f} MB per CPU second"),
    ]


if __name__ == "__main__":
    print_run(run)
