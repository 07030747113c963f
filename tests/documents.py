"""Documents the tests and the ingest benchmark make themselves, with real writers: PDFs by
reportlab (text pages, an outline, a drawn picture) and by Pillow (a scan: pages that are only
an image), Word files by python-docx, reST, a gzipped README and a Latin-1 file.

Each maker returns what the test needs to check against (the words on each page, the picture).
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

LAMP_RED = (200, 30, 30)


def red_square_png(size: tuple[int, int] = (120, 90)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, LAMP_RED).save(buffer, "PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class PdfPage:
    heading: str
    paragraphs: Sequence[str]
    picture: bool = False
    """A red square drawn under the text (on the lower half of the page)."""
    blank: bool = False
    """A page with no text at all."""


MANUAL_PAGES = (
    PdfPage("Harbour Lamp Manual", ["The harbour lamp stands on the north mole and burns paraffin oil.",
                                     "Keepers light it half an hour before sunset."]),
    PdfPage("Cleaning the Lens", ["Wipe the fresnel lens with a soft chamois cloth every morning.",
                                  "Never use sea water on the brass frame."], picture=True),
    PdfPage("", [], blank=True),
    PdfPage("Storm Signals", ["During a gale the keeper hoists two black cones on the signal mast.",
                              "The foghorn sounds twice every minute while visibility is under one mile."]),
)


def text_pdf(path: Path, pages: Sequence[PdfPage] = MANUAL_PAGES, *, title: str = "Harbour Lamp Manual") -> Path:
    """A PDF with a text layer: each page's heading in bold, its paragraphs below, an outline
    entry per heading, and the metadata title."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path), pagesize=A4)
    pdf.setTitle(title)
    width, height = A4
    for number, page in enumerate(pages, start=1):
        if page.heading:
            pdf.bookmarkPage(f"p{number}")
            pdf.addOutlineEntry(page.heading, f"p{number}", level=0)
            pdf.setFont("Helvetica-Bold", 18)
            pdf.drawString(72, height - 72, page.heading)
        pdf.setFont("Helvetica", 11)
        y = height - 110
        for paragraph in page.paragraphs:
            pdf.drawString(72, y, paragraph)
            y -= 28
        if page.picture:
            pdf.drawImage(ImageReader(io.BytesIO(red_square_png())), 72, 120, width=width - 144, height=260)
        pdf.showPage()
    pdf.save()
    return path


def scanned_pdf(path: Path, pages: int = 2) -> Path:
    """Pages that are only pictures, as a scanner writes them: no text layer at all."""
    images = []
    for number in range(pages):
        image = Image.new("RGB", (620, 877), "white")
        for row in range(10):
            image.paste((40, 40, 40), (60, 80 + row * 60 + number, 560, 96 + row * 60))
        images.append(image)
    images[0].save(path, "PDF", save_all=True, append_images=images[1:], resolution=72)
    return path


def manual_docx(path: Path) -> Path:
    """A Word file with headings, a paragraph, a picture with alt text, a table and a list."""
    import docx
    from docx.shared import Inches

    document = docx.Document()
    document.add_heading("Wick Trimming Guide", level=1)
    document.add_paragraph("A well trimmed wick gives a steady flame without soot.")
    document.add_heading("Tools", level=2)
    document.add_paragraph("Use the curved wick scissors kept in the brass box.")
    shape = document.add_picture(io.BytesIO(red_square_png()), width=Inches(1.5))
    shape._inline.docPr.set("descr", "The curved wick scissors")
    table = document.add_table(rows=2, cols=2)
    for (row, column), text in {(0, 0): "Part", (0, 1): "Interval", (1, 0): "Wick", (1, 1): "Weekly"}.items():
        table.cell(row, column).text = text
    document.add_paragraph("Trim the corners square", style="List Bullet")
    document.save(str(path))
    return path


RST_GUIDE = """\
Fog Signal Handbook
===================

.. contents::

Bells
-----

The fog bell is struck every fifteen seconds.

.. note:: Oil the bell hinge monthly.

.. image:: {picture}
   :alt: The fog bell on its frame

Horns
-----

The diaphone horn needs compressed air at four bar.
"""


def rst_guide(path: Path, picture: str = "bell.png") -> Path:
    path.write_text(RST_GUIDE.format(picture=picture))
    (path.parent / picture).write_bytes(red_square_png((40, 40)))
    return path


README_TEXT = "Tide Tables\n\nHigh water at the north mole is forty minutes after the town quay.\n"


def gzipped_readme(folder: Path) -> Path:
    path = folder / "README.gz"
    path.write_bytes(gzip.compress(README_TEXT.encode()))
    return path


LATIN1_TEXT = ("Le gardien du phare allume la lanterne à la tombée de la nuit.\n\n"
               "Après la tempête, il note la hauteur des vagues et vérifie la lentille de Fresnel.\n")


def latin1_file(path: Path) -> Path:
    path.write_bytes(LATIN1_TEXT.encode("latin-1"))
    return path
