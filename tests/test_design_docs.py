"""The design in docs/design/ stays true to the code: every rule id that code, tests, docs or
messages cite is defined there exactly once; every local link in the README and docs/ resolves
inside the repository; and every module, function and test the design names still exists.

What counts as a rule id comes from the docs themselves: the parts table in
docs/design/rules/README.md lists the letters (a row per part, with its page), and a definition
is a heading `### <id> <title>`, a numbered step `- **<id>** ...`, or a paragraph opening with
`**<id> <title>.**`, on a part's page. Adding a
rule or a part is an edit to the docs only.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.conftest import REPO

DESIGN = REPO / "docs" / "design"
RULES = DESIGN / "rules"
INDEX = RULES / "README.md"
THIS_FILE = Path(__file__).resolve()

PYTHON_ROOTS = ("capabilities", "worker", "tests", "bench")
MARKDOWN = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))
COMMENTED_TEXT = ("Makefile", "Procfile", "pyproject.toml", ".ci/run", "deploy")  # only their `#` comments count

_PART_ROW = re.compile(r"^\|\s*`?([A-Z]{1,3})`?\s*\|\s*\[[^\]]*\]\(([^)]+)\)")
_SECTION_ROW = re.compile(r"^\|\s*§(\d+(?:\.\d+)*)\s*\|")
_SECTION_CITED = re.compile(r"§(\d+(?:\.\d+)*)")
_NOT_CITATIONS = re.compile(r"noqa(?::\s*[A-Z]+\d+(?:\s*,\s*[A-Z]+\d+)*)?|type:\s*ignore\[[^\]]*\]|pragma:[^#]*")
# The design documents this repository replaced; a citation of one points at nothing in a clone.
_OUTSIDE_DESIGN = re.compile(
    r"\.\./shared|shared/design|\b(?:CAPABILITIES|ARCHITECTURE|STYLE)\.md\b|\bAPI-NOTES\b|\bSTYLE (?:\d|practice)"
)


# --- what the docs define -----------------------------------------------------------------------


@cache
def parts() -> dict[str, Path]:
    """Part letter -> its page, from the parts table."""
    found = {}
    for line in INDEX.read_text().splitlines():
        match = _PART_ROW.match(line)
        if match:
            found[match.group(1)] = (RULES / match.group(2)).resolve()
    return found


@cache
def id_pattern() -> re.Pattern[str]:
    """A rule id: a part's letter(s) and a number, with optional `.n` steps. A letter or digit
    before it, or a digit after it, makes it part of another word; a scenario letter after it does
    not (`test_C7c_...` cites C7)."""
    letters = "|".join(sorted(parts(), key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z0-9])((?:{letters})\d+(?:\.\d+)*)(?![0-9])")


def definitions() -> dict[str, list[str]]:
    """Rule id -> where it is defined (page:line)."""
    ids = id_pattern().pattern
    heading = re.compile(rf"^#{{2,6}}\s+{ids}(?=\s|$)")
    step = re.compile(rf"^\s*[-*]\s+\*\*{ids}\*\*")
    paragraph = re.compile(rf"^\*\*{ids}\s")  # `**I1 Served configs.** ...`, as docs/interfaces.md writes them
    found: dict[str, list[str]] = defaultdict(list)
    for page in sorted(set(parts().values())):
        for n, line in enumerate(page.read_text().splitlines(), start=1):
            match = heading.match(line) or step.match(line) or paragraph.match(line)
            if match:
                found[match.group(1)].append(f"{page.relative_to(REPO)}:{n}")
    return found


def defined_sections() -> set[str]:
    return {m.group(1) for line in INDEX.read_text().splitlines() if (m := _SECTION_ROW.match(line))}


# --- where citations can be ---------------------------------------------------------------------


def python_files() -> Iterator[Path]:
    for root in PYTHON_ROOTS:
        yield from sorted((REPO / root).rglob("*.py"))


def python_text(path: Path) -> Iterator[tuple[int, str]]:
    """Comments, strings (docstrings and messages) and the names of functions and classes (test
    names cite rule ids), never other identifiers: a constant named like an id cites nothing."""
    previous = ""
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], _NOT_CITATIONS.sub("", token.string)
        elif token.type == tokenize.STRING:
            for offset, line in enumerate(token.string.splitlines()):
                yield token.start[0] + offset, line
        elif token.type == tokenize.NAME and previous in ("def", "class"):
            yield token.start[0], token.string
        if token.type == tokenize.NAME:
            previous = token.string


def commented_files() -> Iterator[Path]:
    for name in COMMENTED_TEXT:
        path = REPO / name
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            yield path


def comments(path: Path) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if line.lstrip().startswith("#"):
            yield n, line
        elif " #" in line:
            yield n, line.split(" #", 1)[1]


@cache
def cited_text() -> tuple[tuple[str, int, str], ...]:
    """(file, line, text) for everything that may cite a rule id or a design document."""
    found: list[tuple[str, int, str]] = []
    for path in python_files():
        found += [(str(path.relative_to(REPO)), n, text) for n, text in python_text(path)]
    for path in MARKDOWN:
        found += [(str(path.relative_to(REPO)), n, text) for n, text in enumerate(path.read_text().splitlines(), 1)]
    for path in commented_files():
        found += [(str(path.relative_to(REPO)), n, text) for n, text in comments(path)]
    return tuple(found)


# --- rule ids -----------------------------------------------------------------------------------


def test_the_parts_table_names_existing_pages() -> None:
    assert parts(), f"{INDEX.relative_to(REPO)} has no parts table"
    missing = [f"{letter}: {page}" for letter, page in parts().items() if not page.is_file()]
    assert not missing, "parts whose page does not exist:\n" + "\n".join(missing)


def test_every_rule_id_is_defined_once_on_its_parts_page() -> None:
    defined = definitions()
    repeated = [f"{rule}: {', '.join(where)}" for rule, where in sorted(defined.items()) if len(where) > 1]
    pages = {letter: f"{page.relative_to(REPO)}:" for letter, page in parts().items()}
    misplaced = [
        f"{rule} defined in {where[0]}"
        for rule, where in sorted(defined.items())
        if not where[0].startswith(pages[rule.rstrip("0123456789.")])
    ]
    assert not repeated and not misplaced, "\n".join(
        ["rule ids defined more than once:", *repeated, "rule ids defined outside their part's page:", *misplaced]
    )


def test_every_cited_rule_id_is_defined_in_docs_design() -> None:
    defined = definitions()
    pattern = id_pattern()
    undefined: dict[str, list[str]] = defaultdict(list)
    for where, n, text in cited_text():
        for match in pattern.finditer(text):
            if match.group(1) not in defined:
                undefined[match.group(1)].append(f"{where}:{n}")
    report = [f"{rule}: {', '.join(places[:5])}" for rule, places in sorted(undefined.items())]
    assert not report, (
        "rule ids cited but not defined in docs/design/rules/ (add a `### <id> <title>` entry to the "
        "part's page):\n" + "\n".join(report)
    )


def test_spec_sections_cited_as_paragraph_signs_are_mapped() -> None:
    """A `§n` citation (of the original specification) must have a row in the index's section table,
    itself or a section containing it."""
    sections = defined_sections()
    unmapped = []
    for where, n, text in cited_text():
        for match in _SECTION_CITED.finditer(text):
            number = match.group(1).split(".")
            if not any(".".join(number[:k]) in sections for k in range(len(number), 0, -1)):
                unmapped.append(f"§{match.group(1)}: {where}:{n}")
    assert not unmapped, "sections cited but not in the section table of docs/design/rules/README.md:\n" + "\n".join(
        unmapped
    )


def test_nothing_points_at_design_documents_outside_the_repository() -> None:
    outside = [
        f"{where}:{n}: {match.group()}"
        for where, n, text in cited_text()
        if REPO / where != THIS_FILE
        for match in _OUTSIDE_DESIGN.finditer(text)
    ]
    assert not outside, "citations of design documents a clone does not have (point at docs/design/):\n" + "\n".join(
        outside
    )


# --- links and named files ----------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_REPO_PATH = re.compile(r"`((?:capabilities|worker|tests|bench|docs|deploy|examples)/[\w./-]*)`")


def prose(path: Path) -> str:
    return _FENCE.sub("", path.read_text())


def slugs(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    for line in prose(path).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return found


def broken_links(path: Path) -> Iterator[str]:
    for target in _LINK.findall(prose(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}: ({target})"
        if not linked.is_relative_to(REPO):
            yield f"{where} leaves the repository"
        elif not linked.exists():
            yield f"{where} does not exist"
        elif anchor and linked.suffix == ".md" and anchor not in slugs(linked):
            yield f"{where} has no heading for #{anchor}"


def test_local_links_in_the_readme_and_docs_resolve_inside_the_repository() -> None:
    broken = [problem for path in MARKDOWN for problem in broken_links(path)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_repository_paths_named_in_the_readme_and_docs_exist() -> None:
    """`worker/...py`, `tests/...`, `deploy/...` and the like, written in backticks."""
    missing = []
    for path in MARKDOWN:
        for named in _REPO_PATH.findall(prose(path)):
            last = named.rstrip("/").rsplit("/", 1)[-1]
            if any(c in named for c in "*<{") or last.startswith("."):
                continue  # a pattern, a placeholder, or a file kept out of git
            if not (REPO / named).exists():
                missing.append(f"{path.relative_to(REPO)}: {named}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


_DOC_NAMED = re.compile(r"\b(docs/[\w./-]+\.md)(?:,\s*\"([^\"]+)\")?")


def headings(path: Path) -> set[str]:
    """A page's headings as a pointer names them: lower case, without code marks."""
    return {m.group(1).replace("`", "").lower() for m in re.finditer(r"(?m)^#{1,6}\s+(.*?)\s*$", prose(path))}


def test_docs_pages_and_sections_named_in_code_and_docs_exist() -> None:
    """A pointer such as `docs/design/architecture.md, "Queue"` names a page and one of its headings."""
    missing = []
    for where, n, text in cited_text():
        for page, section in _DOC_NAMED.findall(text):
            path = REPO / page
            if not path.is_file():
                missing.append(f"{where}:{n}: {page} does not exist")
            elif section and section.lower() not in headings(path):
                missing.append(f"{where}:{n}: {page} has no heading {section!r}")
    assert not missing, "pointers to docs that do not resolve:\n" + "\n".join(missing)


# --- code and tests the design names ------------------------------------------------------------

_DOTTED = re.compile(r"`((?:capabilities|worker|tests|bench)(?:\.\w+)+)(?=[`(\s])")
_TESTS_LINE = re.compile(r"^\s*[-*]\s+\*\*Tests:\*\*(.*)$")
_TICKED = re.compile(r"`([^`]+)`")


def module_file(parts_: list[str]) -> Path | None:
    base = REPO.joinpath(*parts_)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defines(source: str, name: str) -> bool:
    """A def, class, assignment, annotated field or imported name called `name` in `source`."""
    n = re.escape(name)
    return bool(
        re.search(rf"(?m)^\s*(?:async\s+def|def|class)\s+{n}\b|^\s*{n}\s*[:=]|^\s*{n},?\s*$|\bimport\s[^\n]*\b{n}\b", source)
    )


def unresolved(dotted: str) -> str | None:
    names = dotted.split(".")
    for split in range(len(names), 0, -1):
        path = module_file(names[:split])
        if path is not None:
            source = path.read_text()
            missing = [name for name in names[split:] if not defines(source, name)]
            return f"{', '.join(missing)} not in {path.relative_to(REPO)}" if missing else None
    return "no such module"


def test_modules_and_functions_named_in_docs_design_exist() -> None:
    stale = []
    for page in sorted(DESIGN.rglob("*.md")):
        for dotted in sorted(set(_DOTTED.findall(prose(page)))):
            problem = unresolved(dotted)
            if problem:
                stale.append(f"{page.relative_to(REPO)}: {dotted}: {problem}")
    assert not stale, "names in docs/design that the code no longer has:\n" + "\n".join(stale)


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def matches(name: str, functions: set[str]) -> bool:
    """`test_L9*` stands for every test named after L9 (`test_L9_...`, `test_L9a_...`), not L10's."""
    if name.endswith("*"):
        head = re.compile(re.escape(name[:-1]) + r"(?![0-9])\w*$")
        return any(head.match(f) for f in functions)
    return name in functions


def test_tests_named_in_docs_design_exist() -> None:
    stale = []
    for page in sorted(DESIGN.rglob("*.md")):
        for n, line in enumerate(page.read_text().splitlines(), start=1):
            match = _TESTS_LINE.match(line)
            if not match:
                continue
            current: Path | None = None
            for item in _TICKED.findall(match.group(1)):
                where = f"{page.relative_to(REPO)}:{n}"
                if item.endswith(".py"):
                    current = REPO / item
                    if not current.is_file():
                        stale.append(f"{where}: {item} does not exist")
                        current = None
                elif item.startswith("test_"):
                    if current is None:
                        stale.append(f"{where}: {item} follows no test file")
                    elif not matches(item, functions_in(current)):
                        stale.append(f"{where}: no {item} in {current.relative_to(REPO)}")
    assert not stale, "tests named in docs/design that do not exist:\n" + "\n".join(stale)
