"""Resolve every ``fetch`` file to the version its source names now, into ``data/sources.json``.

Cheap: HEAD requests, checksum lists and hashes of the mirror's files, no downloads. A pinned
file is copied as it is (no network). The file's bytes depend only on the sources, so DVC
(``always_changed``) reruns this stage every time and ``fetch`` only when a source moved.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import stage_cli
from pipeline.config import data_mirror, load_section
from pipeline.errors import PipelineError, run_cli
from pipeline.sources import FetchParams, read_sources, resolve_all, write_sources


def main(argv: list[str] | None = None) -> None:
    parser = stage_cli.parser(__doc__)
    stage_cli.add_params(parser)
    parser.add_argument("--out", default="data/sources.json", help="the JSON file to write")
    args = parser.parse_args(argv)
    cfg = load_section(FetchParams, "fetch", args.params)
    resolved = resolve_all(cfg, data_mirror())
    out = Path(args.out)
    try:
        before = read_sources(out)
    except PipelineError:  # none yet, or of another format: everything is new
        before = {}
    moved = sorted(k for k, v in resolved.items() if before.get(k) != v)
    write_sources(resolved, out)
    followed = sum(v.source != "pinned" for v in resolved.values())
    change = (f"changed since the last check: {', '.join(moved)}" if before and moved
              else "none changed" if before else "no earlier check to compare with")
    print(f"resolved {len(resolved)} files ({followed} followed) into {out}; {change}")


if __name__ == "__main__":
    run_cli(main)
