"""Every relative link in README.md, docs/*.md and results/README.md resolves in the checkout: to
a file or directory, and where it carries an anchor, to a heading of the file it points at."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md"]

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code spans, where brackets are code."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (hyphens and
    underscores kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in `page`, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


def links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text()))


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("//")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.exists(), page
    broken = []
    for target in filter(_relative, links(page)):
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file or directory")
        elif not path.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {path.name}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_pages_have_links_to_check():
    """The checks above are not vacuous: the front page links the manuals and the results."""
    targets = set(links(ROOT / "README.md"))
    assert {"docs/engine.md", "docs/gate.md", "results/README.md"} <= targets


@pytest.mark.parametrize("heading, anchor", [
    ("Quick start", "quick-start"),
    ("The tiny model's answers", "the-tiny-models-answers"),
    ("Profiles (`run --profile`)", "profiles-run---profile"),
    ("1. Where things live", "1-where-things-live"),
    ("How resident_planning works", "how-resident_planning-works"),
])
def test_slug_is_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_a_missing_file_and_a_missing_anchor_are_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](nowhere.md) [bad](#no-such) `[code](x.md)`\n")
    assert links(page) == ["#title", "nowhere.md", "#no-such"]
    assert anchors(page) == {"title"}
