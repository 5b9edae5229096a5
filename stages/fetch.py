"""Fetch the raw inputs declared in ``params.yaml`` (section ``fetch``), all or nothing.

Each file is checked against its version in ``data/sources.json``, which ``check_sources``
writes just before (a pinned sha256, or what a followed source named). With the environment
variable ``REGRAB_DATA_MIRROR`` set to a folder laid out like ``shared/data`` the files are
copied from there; otherwise they are downloaded with retries and a progress bar. The new
folder replaces ``--out`` only when every file matched (:mod:`pipeline.fetching`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline import stage_cli
from pipeline.config import data_mirror, load_section
from pipeline.errors import run_cli
from pipeline.fetching import fetch_all
from pipeline.sources import FetchParams, check_matches, read_sources


def main(argv: list[str] | None = None) -> None:
    parser = stage_cli.parser(__doc__)
    stage_cli.add_params(parser)
    parser.add_argument("--sources", default="data/sources.json",
                        help="each file's resolved version, as check_sources writes it")
    parser.add_argument("--out", default="data/raw", help="folder the files are written to")
    args = parser.parse_args(argv)
    cfg = load_section(FetchParams, "fetch", args.params)
    mirror = data_mirror()
    resolved = read_sources(args.sources)
    check_matches(cfg, resolved, mirror, args.sources)
    out = Path(args.out)
    hashes, kept = fetch_all(cfg, resolved, out, mirror)
    origin = f"mirror {mirror}" if mirror else "upstream"
    print(f"fetched {len(hashes) - kept} files from {origin} into {out} "
          f"({kept} kept, the same bytes)")


if __name__ == "__main__":
    run_cli(main)
