"""Write the headline of docs/results.md from the committed metrics tables.

Each block between ``<!-- begin generated: NAME ... -->`` and ``<!-- end generated: NAME -->``
is rendered from the report tables the pipeline writes (``SOURCES`` in ``metrics/``), so after
a rerun of the pipeline this script brings the page level with the run. The rest of the page,
and the dated notes in ``docs/results/``, are written by hand.

The ``run`` block says which run made the metrics. It records a digest of the tables it
speaks for: when they change, the script refuses to keep the old words and asks for new ones
with ``--run``, so the page never names a run that did not make its numbers.

Usage:
    python scripts/results_page.py                    # rewrite the generated blocks
    python scripts/results_page.py --run "TEXT"       # ... and say which run made the metrics
    python scripts/results_page.py --check            # exit 1 naming each stale block
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from pipeline.io import atomic_path  # noqa: E402

PAGE = ROOT / "docs" / "results.md"
METRICS = ROOT / "metrics"
#: The tables the blocks read; the run block's digest covers exactly these.
SOURCES = ("nyt25.md", "fewrel.md", "transfer.md", "active_labelling.md")
#: The balanced settings of the headline tables, and the paired column's two.
SETTINGS = ("5w1s", "5w5s", "10w1s", "10w5s", "5w0s", "10w0s")
PAIRED = ("5w1s", "5w5s")
DASH = "–"
#: Generated prose is wrapped to this many columns, as the hand-written pages are.
WIDTH = 95
BEGIN = re.compile(r"^<!-- begin generated: (\w+)\b.*-->$")
DIGEST = re.compile(r"^<!-- metrics sha256: (.*) -->$")


class PageError(Exception):
    """A metrics table or a page block is missing or malformed; the message says which."""


@dataclass(frozen=True)
class Table:
    """One Markdown table of a metrics file: its ``## `` section, caption, header and rows."""

    section: str
    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def row(self, *key: str) -> dict[str, str] | None:
        """The first row whose leading cells are ``key``, as ``{column: cell}``; None if none."""
        for cells in self.rows:
            if cells[:len(key)] == key:
                if len(cells) != len(self.header):
                    raise PageError(f"a row of the table '{self.caption[:40]}...' has "
                                    f"{len(cells)} cells for {len(self.header)} columns")
                return dict(zip(self.header, cells, strict=True))
        return None


def cells(line: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in line.strip().strip("|").split("|"))


def read_tables(text: str) -> list[Table]:
    """Every table of a report page, with the paragraph above it as its caption."""
    out: list[Table] = []
    section, para, last, table = "", [], [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            rows = tuple(cells(r) for r in table[2:])
            out.append(Table(section, " ".join(para or last), cells(table[0]), rows))
            table, para, last = [], [], []
        if line.startswith("## "):
            section, para, last = line[3:].strip(), [], []
        elif line.strip():
            para.append(line.strip())
        elif para:
            para, last = [], para
    return out


def find(tables: list[Table], caption: str, section: str = "", source: str = "") -> Table:
    """The table whose caption starts with ``caption`` (in ``section``, when given)."""
    for table in tables:
        if table.caption.startswith(caption) and (not section or table.section == section):
            return table
    where = f" under '## {section}'" if section else ""
    raise PageError(f"{source} has no table '{caption}...'{where}; rerun the pipeline "
                    "(dvc repro) or update scripts/results_page.py to its new layout")


def mean(cell: str) -> float | None:
    """The leading number of a cell (``**79.24** ± 9.22`` -> 79.24); None for a dash."""
    match = re.match(r"^\**([+-]?\d+(?:\.\d+)?)", cell.strip())
    return float(match.group(1)) if match else None


def negate(cell: str) -> str:
    """A paired difference the other way round, its wins dropped (``-7.20 ± 1.96 (0/5 wins)``
    -> ``+7.20 ± 1.96``): the metrics hold method - REGRAB, the page REGRAB - method."""
    text = re.sub(r"\s*\([^)]*\)\s*$", "", cell.strip())
    match = re.match(r"^([+-]?)(\d+)\.(\d+)(.*)$", text)
    if not match:
        return text
    value = -float(f"{match.group(1)}{match.group(2)}.{match.group(3)}") + 0.0
    return f"{value:+.{len(match.group(3))}f}{match.group(4)}"


def bold_best(rows: list[list[str]], columns: range) -> list[list[str]]:
    """Bold the highest mean of each column (every one that ties), as the README does."""
    for col in columns:
        values = [mean(r[col]) for r in rows]
        best = max((v for v in values if v is not None), default=None)
        for r, v in zip(rows, values, strict=True):
            if v is not None and v == best:
                r[col] = re.sub(r"^(\S+)", r"**\1**", r[col], count=1)
    return rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def source(metrics: Path, name: str) -> str:
    """The text of ``metrics/<name>``, refused in one line when the pipeline has not run."""
    path = metrics / name
    if not path.is_file():
        raise PageError(f"{path} not found; run the pipeline (dvc repro) first, or give "
                        "--metrics the folder that holds it")
    return path.read_text()


def sizes(metrics: Path, name: str) -> dict[str, str]:
    """``{method: "5 x 1000"}``: splits x episodes per setting and split, from the notes."""
    text = source(metrics, name)
    found = re.search(r"of (\d+) split\(s\), (\d+) episodes per setting", text)
    if not found:
        raise PageError(f"{metrics / name} does not say its splits and episodes "
                        "('... of N split(s), E episodes per setting and split')")
    default = f"{found.group(1)} x {found.group(2)}"
    out = {m: f"{s} x {e}" for m, s, e in re.findall(
        r"(\w+) \((\d+) split\(s\), (\d+) episodes per setting and split\)", text)}
    return {"": default, **out}


def accuracy_block(metrics: Path, name: str) -> str:
    """The balanced settings of every method, splits x episodes, REGRAB minus it, paired."""
    tables = read_tables(source(metrics, name))
    acc = find(tables, "Accuracy %", source=name)
    paired = find(tables, "Paired difference vs regrab", source=name)
    size = sizes(metrics, name)
    rows = []
    for method, *_ in acc.rows:
        row = acc.row(method)
        pair = paired.row(f"{method}_minus_regrab")
        diff = " / ".join(negate(pair[s]) for s in PAIRED) if pair else DASH
        rows.append([method, size.get(method, size[""]), *(row[s] for s in SETTINGS), diff])
    bold_best(rows, range(2, 2 + len(SETTINGS)))
    header = ["method", "splits x episodes", *SETTINGS,
              f"REGRAB − method, paired, {' / '.join(PAIRED)}"]
    one_split = size[""].startswith("1 x")
    spread = ("one split, so no interval over splits" if one_split else
              "mean over the splits ± Student-t 95% interval of the split means")
    return (f"Accuracy % on the test relations ([every table: `metrics/{name}`]"
            f"(../metrics/{name})): {spread}; every method on the same episodes, and the "
            "paired column on the episodes both methods ran.\n\n"
            + markdown(header, rows))


def support_block(metrics: Path) -> str:
    """Unequal and mislabelled support sets, REGRAB and every method, on both benchmarks."""
    parts = []
    for name, title in (("nyt25.md", "NYT-25"), ("fewrel.md", "FewRel")):
        tables = read_tables(source(metrics, name))
        acc = find(tables, "Accuracy %", source=name)
        gain = find(tables, "5w1-5s minus 5w1-5s_cut1", source=name)
        share = find(tables, "Step protocol of 5w1-5s", source=name)
        noisy = find(tables, "A mislabelled support sentence", source=name)
        rows = []
        for method, *_ in acc.rows:
            g, s, n = gain.row(method), share.row(method), noisy.row(method)
            rows.append([method, acc.row(method)["5w1-5s"], g["gain"] if g else DASH,
                         s["share"] if s else DASH, n["cost"] if n else DASH,
                         n["AUROC"] if n else DASH])
        header = ["method", "5w1-5s", "gain over cut to 1 shot", "share to the 5-shot way "
                  "(truth 20)", "cost of 1 mislabelled in 5w5s", "suspicion AUROC"]
        parts.append(f"**{title}** ([`metrics/{name}`](../metrics/{name}))\n\n"
                     + markdown(header, rows))
    return ("5w1-5s: 1 to 5 labelled sentences per relation; the gain is over the same "
            "episodes cut to one per relation (paired); the share is of the predictions given "
            "to the one relation with 5 among 1-sentence ones; the cost is 5w5s with one "
            "support sentence replaced by another relation's, and the AUROC is how well the "
            "method's suspicion score finds it.\n\n" + "\n\n".join(parts))


def abstain_block(metrics: Path) -> str:
    """Out-of-set detection AUROC on both benchmarks (each method's best score)."""
    parts = []
    for name, title in (("nyt25.md", "NYT-25"), ("fewrel.md", "FewRel")):
        det = find(read_tables(source(metrics, name)), "Out-of-set detection", source=name)
        columns = list(det.header[2:])
        rows = []
        for method in dict.fromkeys(r[0] for r in det.rows):
            row = det.row(method, "best") or det.row(method, "best_point")
            rows.append([method, *(row[c].split(" / ")[0] for c in columns)])
        bold_best(rows, range(1, 1 + len(columns)))
        parts.append(f"**{title}** ([`metrics/{name}`](../metrics/{name}))\n\n"
                     + markdown(["method", *columns], rows))
    return ("Out-of-set detection AUROC % (higher is better): `_r15` has 16% of the queries "
            "from relations outside the episode, `_r50` 52%; each method's best uncertainty "
            "score, chosen on validation relations.\n\n" + "\n\n".join(parts))


def transfer_block(metrics: Path) -> str:
    """SemEval with true names, both benchmarks' checkpoints; names shuffled, paired."""
    tables, parts = read_tables(source(metrics, "transfer.md")), []
    for checkpoints in ("nyt25", "fewrel"):
        section = f"semeval, {checkpoints} checkpoints"
        acc = find(tables, "Accuracy %", section, "transfer.md")
        rows = bold_best([[m, *(acc.row(m)[s] for s in SETTINGS)] for m, *_ in acc.rows],
                         range(1, 1 + len(SETTINGS)))
        parts.append(f"**SemEval-2010, {checkpoints} checkpoints**\n\n"
                     + markdown(["method", *SETTINGS], rows))
    rows = []
    for table in tables:
        if table.caption.startswith("Paired difference vs regrab") and (
                "shuffled" in table.section):
            pair = table.row("regrab_no_prior_minus_regrab")
            rows.append([table.section, *(negate(pair[s]) for s in SETTINGS[:4])])
    if not rows:
        raise PageError("transfer.md has no shuffled-names section; rerun the pipeline")
    parts.append("**Names shuffled among the relations**: REGRAB − `regrab_no_prior`, paired "
                 "(a wrong name should cost little)\n\n"
                 + markdown(["set, checkpoints", *SETTINGS[:4]], rows))
    return ("Accuracy % on relations no model trained on ([every table: "
            "`metrics/transfer.md`](../metrics/transfer.md)); the priors read each "
            "relation's name and description.\n\n" + "\n\n".join(parts))


def labelling_block(metrics: Path) -> str:
    """The labelling curves' tables and their bars, as the stage wrote them."""
    text = source(metrics, "active_labelling.md").strip()
    if "\n## " not in text:
        raise PageError("active_labelling.md has no '## ' sections; rerun the pipeline")
    text = re.sub(r"^## (.*)$", r"**\1**", text, flags=re.MULTILINE)
    return (f"{text}\n\n([`metrics/active_labelling.md`](../metrics/active_labelling.md), "
            "as the `active_labelling` stage wrote it.)")


BLOCKS: dict[str, Callable[[Path], str]] = {
    "nyt25": lambda m: accuracy_block(m, "nyt25.md"),
    "fewrel": lambda m: accuracy_block(m, "fewrel.md"),
    "support": support_block,
    "abstain": abstain_block,
    "transfer": transfer_block,
    "labelling": labelling_block,
}


def digest(metrics: Path) -> str:
    """``nyt25.md 0123456789ab, ...``: the first 12 hex digits of each source's sha256."""
    return ", ".join(f"{n} {hashlib.sha256(source(metrics, n).encode()).hexdigest()[:12]}"
                     for n in SOURCES)


def blocks_of(page: str) -> dict[str, tuple[int, int]]:
    """``{name: (first line inside, end marker line)}`` of the page's generated blocks."""
    lines, found, open_ = page.splitlines(), {}, None
    for i, line in enumerate(lines):
        if match := BEGIN.match(line.strip()):
            if open_:
                raise PageError(f"block {open_[0]} has no end marker before block {match[1]}")
            open_ = (match.group(1), i + 1)
        elif line.strip().startswith("<!-- end generated:"):
            if not open_ or line.strip() != f"<!-- end generated: {open_[0]} -->":
                raise PageError(f"stray end marker on line {i + 1}: {line.strip()}")
            found[open_[0]] = (open_[1], i)
            open_ = None
    if open_:
        raise PageError(f"block {open_[0]} has no end marker")
    return found


def run_block(metrics: Path, old: str, run: str | None) -> str:
    """The run block: ``run`` (or the page's old words while the metrics are unchanged)."""
    lines = old.strip().splitlines()
    said = next((DIGEST.match(x) for x in lines[:1] if DIGEST.match(x)), None)
    now = digest(metrics)
    if run is None:
        if not said or said.group(1) != now:
            raise PageError("the metrics changed since the page said which run made them; "
                            "rerun with --run 'when, where and how the pipeline ran'")
        run = "\n".join(lines[1:])
    return f"<!-- metrics sha256: {now} -->\n\n{' '.join(run.split())}"


def wrap(text: str) -> str:
    """Prose paragraphs filled to ``WIDTH`` columns; tables and comments as they are."""
    return "\n\n".join(
        p if p.startswith(("|", "<!--")) else textwrap.fill(
            " ".join(p.split()), WIDTH, break_long_words=False, break_on_hyphens=False)
        for p in text.split("\n\n"))


def block(name: str, metrics: Path, old: str, run: str | None = None) -> str:
    """One block's text: the run's words, or the tables of ``metrics`` it shows."""
    if name == "run":
        return wrap(run_block(metrics, old, run))
    if name not in BLOCKS:
        raise PageError(f"unknown generated block {name}; known: run, {', '.join(BLOCKS)}")
    return wrap(BLOCKS[name](metrics))


def render(page: str, metrics: Path = METRICS, run: str | None = None) -> str:
    """The page with every generated block rendered from ``metrics``."""
    spans, lines = blocks_of(page), page.splitlines()
    missing = [n for n in ["run", *BLOCKS] if n not in spans]
    if missing:
        raise PageError(f"the page has no generated block {', '.join(missing)}; add "
                        f"'<!-- begin generated: NAME -->' and '<!-- end generated: NAME -->'")
    out, last = [], 0
    for name, (start, end) in sorted(spans.items(), key=lambda kv: kv[1]):
        body = block(name, metrics, "\n".join(lines[start:end]), run)
        out += lines[last:start] + ["", body, ""]
        last = end
    out += lines[last:]
    return "\n".join(out) + "\n"


def stale(page: str, metrics: Path = METRICS) -> list[str]:
    """The names of the page's blocks whose text differs from the metrics' (run: digest)."""
    spans, lines, names = blocks_of(page), page.splitlines(), []
    for name, (start, end) in spans.items():
        old = "\n".join(lines[start:end]).strip()
        try:
            new = block(name, metrics, old)
        except PageError:
            if name != "run":
                raise
            names.append(name)
            continue
        if old != new.strip():
            names.append(name)
    return names + [n for n in ["run", *BLOCKS] if n not in spans]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 naming each block that differs from metrics/")
    parser.add_argument("--run", help="which run made the metrics (date, times, machine, "
                        "command); required when they changed since the page said so")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (docs/results.md)")
    parser.add_argument("--metrics", type=Path, default=METRICS, help="the metrics folder")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"error: {args.page} not found; give --page the results page", file=sys.stderr)
        return 2
    page = args.page.read_text()
    try:
        if args.check:
            names = stale(page, args.metrics)
            for name in names:
                print(f"{args.page}: block {name} is stale; run python scripts/results_page.py"
                      + (" --run '...'" if name == "run" else ""))
            return 1 if names else 0
        text = render(page, args.metrics, args.run)
    except PageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with atomic_path(args.page) as tmp:
        tmp.write_text(text)
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
