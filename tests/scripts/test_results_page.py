"""docs/results.md's generated blocks are current, and the README's results tables equal the
committed metrics tables they are copied from (scripts/results_page.py)."""

from __future__ import annotations

import re
import shutil

import pytest

from scripts import results_page
from scripts.results_page import find, negate, read_tables, sizes
from tests.conftest import ROOT

README = ROOT / "README.md"
PAIRED_HEADER = "REGRAB − method, paired"
#: README row labels that name a method otherwise than the metrics do.
ALIASES = {"floor (untrained)": "floor"}


def section_table(text: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """The first table under the ``### heading`` of a page: header and rows, bold removed."""
    lines = text.splitlines()
    start = lines.index(f"### {heading}")
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.replace("**", "") for c in results_page.cells(line)])
        elif rows:
            break
    assert len(rows) > 2, f"no table under '### {heading}'"
    return rows[0], rows[2:]


def readme_mismatches(readme: str, heading: str, name: str) -> list[str]:
    """Every cell of the README table under ``heading`` that differs from ``metrics/<name>``.

    Setting columns must equal the metrics' accuracy cell (mean and interval as written);
    ``splits x episodes`` the metrics' notes; the paired column REGRAB minus the method from
    the metrics' paired-difference table. Rows naming the paper are not ours to check.
    """
    tables = read_tables((ROOT / "metrics" / name).read_text())
    acc = find(tables, "Accuracy %", source=name)
    paired = find(tables, "Paired difference vs regrab", source=name)
    size = sizes(ROOT / "metrics", name)
    header, rows = section_table(readme, heading)
    assert {"5w1s", "5w5s", "10w1s", "10w5s"} <= set(header), header
    bad, checked = [], 0
    for row in rows:
        label = row[0]
        if label.startswith("paper"):
            continue
        method = ALIASES.get(label, label)
        ours = acc.row(method)
        if ours is None:
            bad.append(f"{heading}: {label} is not a method of metrics/{name}")
            continue
        for column, cell in zip(header[1:], row[1:], strict=True):
            if column in acc.header:
                want = ours[column]
            elif column == "splits x episodes":
                want = size.get(method, size[""])
            elif column.startswith(PAIRED_HEADER):
                settings = column.rsplit(",", 1)[1].split("/")
                pair = paired.row(f"{method}_minus_regrab")
                want = (" / ".join(negate(pair[s.strip()]) for s in settings) if pair
                        else results_page.DASH)
            else:
                bad.append(f"{heading}: column {column!r} is not checked against the metrics")
                continue
            checked += 1
            if cell != want:
                bad.append(f"{heading}, {label}, {column}: README {cell!r}, metrics {want!r}")
    assert checked, f"nothing checked under '### {heading}'"
    return bad


TABLES = [("NYT-25 test relations", "nyt25.md"), ("FewRel val_wiki relations", "fewrel.md")]


def test_committed_page_is_current(capsys):
    """Fails when metrics/*.md changed (a rerun) without rerunning the script."""
    assert results_page.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(("heading", "name"), TABLES)
def test_readme_results_tables_equal_the_metrics(heading, name):
    assert readme_mismatches(README.read_text(), heading, name) == []


@pytest.mark.parametrize(("old", "new"), [
    ("| **79.24** ± 9.22 |", "| **79.25** ± 9.22 |"),         # NYT-25 mean, bold
    ("| 47.78 ± 15.77 |", "| 47.78 ± 15.76 |"),                # NYT-25 interval
    ("+1.44 ± 0.92 / +0.20 ± 0.27", "+1.44 ± 0.92 / +0.21 ± 0.27"),  # paired column
    ("| maml | 3 x 250 |", "| maml | 5 x 1000 |"),             # splits x episodes
    ("| 84.51 | 90.57 |", "| 84.51 | 90.58 |"),                # FewRel
    ("| floor (untrained) | 61.25 |", "| floor (untrained) | 61.52 |"),
])
def test_an_edited_readme_number_is_found(old, new):
    text = README.read_text()
    assert text.count(old) == 1, old
    edited = text.replace(old, new)
    assert sum(len(readme_mismatches(edited, h, n)) for h, n in TABLES) == 1


def test_negate_turns_method_minus_regrab_round():
    assert negate("-7.20 ± 1.96 (0/5 wins)") == "+7.20 ± 1.96"
    assert negate("+0.64 (1/1 wins)") == "-0.64"
    assert negate("-0.00 ± 1.15") == "+0.00 ± 1.15"
    assert negate("–") == "–"


def test_read_tables_keeps_section_and_caption():
    text = ("Caption one\nstill one\n\n| a | b |\n|---|---|\n| x | 1 |\n\nNote.\n\n"
            "## part\n\nCaption two\n\n| a | b |\n|---|---|\n| y | 2 |\n")
    first, second = read_tables(text)
    assert (first.section, first.caption, first.row("x")) == ("", "Caption one still one",
                                                             {"a": "x", "b": "1"})
    assert (second.section, second.caption, second.row("y")["b"]) == ("part", "Caption two", "2")
    assert find([first, second], "Caption", "part") is second


@pytest.fixture
def copy(tmp_path):
    """The committed page and metrics tables in a scratch folder."""
    (tmp_path / "metrics").mkdir()
    for name in results_page.SOURCES:
        shutil.copy(ROOT / "metrics" / name, tmp_path / "metrics" / name)
    shutil.copy(results_page.PAGE, tmp_path / "results.md")
    return tmp_path


def args(where, *more):
    return ["--page", str(where / "results.md"), "--metrics", str(where / "metrics"), *more]


def test_a_rerun_with_other_numbers_makes_blocks_stale_until_the_run_is_named(copy, capsys):
    table = copy / "metrics" / "nyt25.md"
    table.write_text(table.read_text().replace("| regrab | 79.24 ± 9.22 |",
                                               "| regrab | 79.31 ± 9.22 |"))
    assert results_page.main(args(copy, "--check")) == 1
    out = capsys.readouterr().out
    assert "block run is stale" in out and "block nyt25 is stale" in out
    assert "block fewrel" not in out
    before = (copy / "results.md").read_text()
    assert results_page.main(args(copy)) == 2  # the page would name a run that did not make it
    err = capsys.readouterr().err
    assert err.startswith("error: the metrics changed") and err.count("\n") == 1
    assert (copy / "results.md").read_text() == before
    assert results_page.main(args(copy, "--run", "A run of 2030-01-01 on a test machine.")) == 0
    page = (copy / "results.md").read_text()
    assert "**79.31** ± 9.22" in page and "A run of 2030-01-01 on a test machine." in page
    assert results_page.main(args(copy, "--check")) == 0
    assert results_page.main(args(copy)) == 0  # unchanged metrics keep the run's words
    assert (copy / "results.md").read_text() == page


def test_a_hand_edit_inside_a_block_is_stale_and_outside_is_kept(copy, capsys):
    page = copy / "results.md"
    text = page.read_text()
    page.write_text(text.replace("| proto_label | 5 x 1000 | 77.80",
                                 "| proto_label | 5 x 1000 | 77.90")
                    .replace("## Notes: every trial, dated",
                             "## Notes: every trial, dated\n\nMine."))
    assert results_page.main(args(copy, "--check")) == 1
    assert re.findall(r"block (\w+) is stale", capsys.readouterr().out) == ["nyt25"]
    assert results_page.main(args(copy)) == 0
    assert "77.80" in page.read_text() and "\nMine.\n" in page.read_text()


def test_missing_inputs_are_refused_in_one_line(copy, capsys):
    page = copy / "results.md"
    before = page.read_text()
    (copy / "metrics" / "fewrel.md").unlink()
    assert results_page.main(args(copy)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fewrel.md not found" in err and err.count("\n") == 1
    assert page.read_text() == before
    assert results_page.main(["--page", str(copy / "nothing.md")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_a_page_without_a_block_is_stale_and_refused(copy, capsys):
    page = copy / "results.md"
    page.write_text(re.sub(r"<!-- (begin|end) generated: labelling[^>]*-->\n", "",
                           page.read_text()))
    assert results_page.main(args(copy, "--check")) == 1
    assert re.findall(r"block (\w+) is stale", capsys.readouterr().out) == ["labelling"]
    assert results_page.main(args(copy)) == 2
    assert "no generated block labelling" in capsys.readouterr().err
