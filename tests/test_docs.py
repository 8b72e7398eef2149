"""The README and docs/: every relative link and image resolves (the file, and the heading
an ``#anchor`` names, as GitHub spells anchors), every page in docs/ is reachable from the
README, and the README stays a short page for a newcomer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Link:
    page: Path  # the Markdown file the link is in
    target: str  # as written, e.g. docs/cache.md#the-prefix-cache

    def __str__(self) -> str:
        return f"{shown(self.page)}: ({self.target})"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links_in(page: Path) -> list[Link]:
    return [Link(page, m.group(1)) for m in LINK.finditer(prose(page.read_text(encoding="utf-8")))]


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)  # http:, mailto:, ...


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, formatting and punctuation dropped, each
    space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor the page's headings give; a repeated heading gets -1, -2 ..."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken(link: Link) -> str | None:
    """Why the link does not resolve, or None."""
    path, _, anchor = link.target.partition("#")
    target = (link.page.parent / path).resolve() if path else link.page
    if not target.exists():
        return f"{link}: no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{link}: no heading gives #{anchor} in {shown(target)}"
    return None


def test_the_pages_are_there():
    assert README.is_file() and len(pages()) > 3, "README.md and docs/*.md"


@pytest.mark.parametrize("page", pages(), ids=shown)
def test_every_relative_link_resolves(page):
    relative = [link for link in links_in(page) if is_relative(link.target)]
    problems = [why for link in relative if (why := broken(link))]
    assert not problems, "broken links:\n  " + "\n  ".join(problems)


def test_every_docs_page_is_linked_from_the_readme():
    relative = [link for link in links_in(README) if is_relative(link.target)]
    linked = {(ROOT / link.target.partition("#")[0]).resolve() for link in relative}
    orphans = [shown(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not orphans, "docs pages the README does not link: " + ", ".join(orphans)


def test_the_readme_stays_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines (keep it under {README_MAX_LINES}): "
        "move detail into docs/ and link it"
    )


def test_slug_spells_anchors_as_github_does():
    assert (
        slug("Batched decode against mlx_lm.server (`bench serve --against mlx-lm`)")
        == "batched-decode-against-mlx_lmserver-bench-serve---against-mlx-lm"
    )
    assert slug("The window's responsiveness") == "the-windows-responsiveness"
    assert (
        slug("When things go wrong: a full disk, a damaged database")
        == "when-things-go-wrong-a-full-disk-a-damaged-database"
    )


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    text = (
        "# Title\n\nSee [there](missing.md), [here](#title), [no](#nowhere) "
        "and `[code](not-a-link.md)`.\n```\n[fenced](also-not.md)\n```\n"
    )
    page.write_text(text, encoding="utf-8")
    assert [link.target for link in links_in(page)] == ["missing.md", "#title", "#nowhere"]
    assert [broken(link) is None for link in links_in(page)] == [False, True, False]
    assert "no such file" in broken(Link(page, "missing.md"))
    assert "no heading gives #nowhere" in broken(Link(page, "#nowhere"))
