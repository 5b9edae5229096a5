"""The README is a map and the pages it links to hold together.

Every relative link in README.md, ARCHITECTURE.md, docs/*.md and the results notes
(docs/results/*.md) must land on a file of the
repository, and a ``#anchor`` on a heading of the page it names (GitHub's heading slugs);
the README stays one screen of map (at most 220 lines) and no paragraph runs past 150 words.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 220
PARAGRAPH_MAX_WORDS = 150

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), with an optional "title"; the text may hold code spans.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages whose links are checked: the README, ARCHITECTURE.md, docs/*.md and below."""
    return [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks (fence lines become blank)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces to -."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The targets of the inline links and images of a page's prose (code spans left out).

    A link's text may run over lines, as wrapped prose does.
    """
    return LINK.findall("\n".join(CODE_SPAN.sub("", line) for line in prose_lines(text)))


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``page`` that do not resolve, each with the reason."""
    bad = []
    for target in links(page.read_text()):
        if SCHEME.match(target):
            continue  # a web address: not checked offline
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(root.resolve()):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def paragraphs(text: str) -> list[str]:
    """Prose paragraphs: blank-line separated, each list item on its own; no tables, headings."""
    out: list[str] = []
    current: list[str] = []
    for line in prose_lines(text) + [""]:
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#")) or LIST_ITEM.match(line):
            if current:
                out.append(" ".join(current))
            current = []
            if not LIST_ITEM.match(line):
                continue
            stripped = LIST_ITEM.sub("", line, count=1).strip()  # the marker is no word
        current.append(stripped)
    return out


def long_paragraphs(text: str, limit: int = PARAGRAPH_MAX_WORDS) -> list[str]:
    """The start of every paragraph of ``text`` longer than ``limit`` words."""
    return [p[:60] for p in paragraphs(text) if len(p.split()) > limit]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.exists()
    assert broken_links(page) == []


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_paragraph_runs_past_150_words(page):
    assert long_paragraphs(page.read_text()) == []


def test_the_readme_is_a_map_of_at_most_220_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


def test_the_readmes_common_tasks_name_the_three_ways_the_project_is_run():
    text = (ROOT / "README.md").read_text()
    tasks = text[text.index("## Common tasks"):text.index("## Development")]
    for command in ("dvc exp run", "regrab-predict", "prefect deployment run",
                    "make prefect-run"):
        assert command in tasks, command


def test_the_readme_links_every_docs_page():
    linked = {Path(t.partition("#")[0]).name for t in links((ROOT / "README.md").read_text())}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} - linked == set()


def test_slugs_follow_github():
    assert slug("The prior: graph and relation label") == "the-prior-graph-and-relation-label"
    assert slug("FewRel's hidden test set (CodaLab answer files)") == (
        "fewrels-hidden-test-set-codalab-answer-files")
    assert slug("FewRel val_wiki, CPU default") == "fewrel-val_wiki-cpu-default"
    assert slug("`regrab-predict` **flags**") == "regrab-predict-flags"
    assert slug("[Linked](x.md) heading") == "linked-heading"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## Part one\n")
    (tmp_path / "img.png").write_bytes(b"")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/b.md) [ok](docs/b.md#part-one) ![ok](img.png) [ok](#here)\n"
        "[web](https://example.com/x#y) `[code](missing.md)`\n\n"
        "```\n[fenced](missing.md)\n```\n\n"
        "## Here\n\n"
        "[gone](docs/missing.md) [bad anchor](docs/b.md#part-two) [self](#nowhere)\n"
        "[png anchor](img.png#top) [out](../elsewhere.md)\n"
        "[a link wrapped\nover lines](docs/b.md#part-three)\n")
    assert broken_links(page, tmp_path) == [
        "docs/missing.md: no such file",
        "docs/b.md#part-two: no heading #part-two in b.md",
        "#nowhere: no heading #nowhere in README.md",
        "img.png#top: no heading #top in img.png",
        "../elsewhere.md: outside the repository",
        "docs/b.md#part-three: no heading #part-three in b.md",
    ]


def test_the_checker_finds_long_paragraphs():
    long = " ".join(["word"] * 151)
    text = (f"{long}\n\n- item\n- {long}\n\n| {long} |\n\n```\n{long}\n```\n\n"
            + " ".join(["word"] * 150) + "\n")
    assert long_paragraphs(text) == [long[:60], long[:60]]
    assert len(paragraphs("one\ntwo\n\n- a\n  b\n- c\n")) == 3
