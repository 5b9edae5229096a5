"""``regrab-models``: list, register, promote and roll back versions; export or convert
a model.

``list`` prints every registered version (git tags ``regrab@vX.Y.Z``) with the headline
accuracies committed with it and which one is promoted (stage ``prod``: what ``regrab-predict
--model regrab`` runs). ``promote regrab@vX.Y.Z`` assigns ``prod`` to that version and
``rollback`` gives it back to the version that held it before; each is one git tag
(``regrab#prod#N``, GTO's convention), published with ``git push --tags``. ``register [REV]``
tags a commit (a scheduled run's ``retrain/<run>`` branch that was not promoted, say) as the
next version, ``regrab@vX.Y.Z``, without promoting it.

``export`` writes a train-stage checkpoint as a self-describing folder (weights, config,
relation labels and graph, the pre-trained encoder, a model card) that ``regrab-predict
--checkpoint DIR`` uses alone, with no project data and no ``params.yaml``. ``--out`` may be
new, empty or a folder export wrote (replaced whole); a folder holding anything else is
refused, or with ``--force`` only export's own files in it are replaced. An ``encoder/``
there holding a file export did not write is refused, ``--force`` or not.

An ``--out`` that is or holds one of export's inputs (the checkpoint, ``--relations``,
``--report``) is refused, ``--force`` or not: export never replaces a file it reads.

``convert`` rewrites a pickle checkpoint of an older version (``model.pt``, ``state.pt``,
TransE's state) as safetensors + JSON. It never replaces a different file that is already
at ``--out`` (the default: beside the pickle) unless ``--force`` says so. Loaders refuse
pickles, because a pickle can run code when it is loaded; convert only files whose origin
you trust. (The pickle is read by torch's restricted unpickler, which admits tensors and
plain containers only.)

Usage:
    regrab-models list
    regrab-models register retrain/<run>
    regrab-models promote regrab@v0.2.0
    regrab-models rollback
    regrab-models export models/nyt25/split_0/regrab/model.safetensors --out my-model \
        [--relations data/wikidata/relations.parquet] [--report metrics/nyt25_report.json] \
        [--no-encoder] [--force]
    regrab-models convert models/nyt25/split_0/regrab/model.pt [--out model.safetensors] \
        [--force]
"""

from __future__ import annotations

import filecmp
from pathlib import Path

from cli.guard import refuse_inside, refuse_same, run_command
from cli.text import shown
from model.files import loader
from model.files.checkpoint import MODEL_FILE, STATE_FILE, convert_legacy
from model.files.model_folder import OWN_ENTRIES, check_out, check_report, export
from pipeline import registry, stage_cli, versions
from pipeline.errors import PipelineError
from pipeline.io import atomic_path, check_writable, resolved


def benchmark_of(checkpoint: Path) -> str | None:
    """``nyt25`` for ``models/nyt25/split_0/regrab/model.safetensors`` (None elsewhere)."""
    parts = resolved(checkpoint, "checkpoint").parts
    for i, part in enumerate(parts[:-1]):
        if part == "models" and i + 2 < len(parts) and parts[i + 2].startswith("split_"):
            return parts[i + 1]
    return None


def run(argv: list[str] | None = None) -> None:
    parser = stage_cli.parser(__doc__, prog="regrab-models")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered versions, their headline metrics, the promoted one")
    pr = sub.add_parser("promote", help=f"make a version the one users run ({registry.PROD})")
    pr.add_argument("version", help=f"{registry.NAME}@vX.Y.Z (see regrab-models list)")
    sub.add_parser("rollback", help=f"give {registry.PROD} back to the version before")
    rg = sub.add_parser("register", help="tag a commit (default HEAD) as the next version")
    rg.add_argument("rev", nargs="?", default="HEAD",
                    help="a commit, tag or branch (a scheduled run's retrain/<run>)")
    ex = sub.add_parser("export", help="write a checkpoint as a self-contained model folder")
    ex.add_argument("checkpoint", type=Path, help=f"a train-stage {MODEL_FILE}")
    ex.add_argument("--out", type=Path, required=True,
                    help="the folder to write: new, empty, or one export wrote (export's "
                         "config.json and no other files), which is replaced whole; any "
                         "other folder is refused (see --force). Stopped (Ctrl-C, SIGTERM, "
                         "an error), export leaves no temporary folder")
    ex.add_argument("--relations", type=Path, default=Path("data/wikidata/relations.parquet"),
                    help="relations table for the graph relations' labels (if present)")
    ex.add_argument("--report", type=Path, default=None,
                    help="metrics/<benchmark>_report.json for the model card (default: the "
                         "one of the checkpoint's benchmark, if present)")
    ex.add_argument("--no-encoder", action="store_true",
                    help="do not copy the pre-trained encoder (loading then needs it installed)")
    ex.add_argument("--force", action="store_true",
                    help=f"write into an --out that holds other files: replace only "
                         f"{', '.join(OWN_ENTRIES)} there, keep everything else")
    cv = sub.add_parser("convert", help="rewrite an older pickle checkpoint you trust")
    cv.add_argument("old", type=Path, help="model.pt, state.pt or a TransE state of an older "
                                           "version")
    cv.add_argument("--out", type=Path, default=None,
                    help=f"where to write (default: {MODEL_FILE} / {STATE_FILE} beside it)")
    cv.add_argument("--force", action="store_true",
                    help="replace a different file already at --out (refused otherwise)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for line in versions.format_listing(versions.listing(versions.project_root())):
            print(shown(line))
        return
    if args.command == "register":
        print(shown(versions.register(args.rev)))
        return
    if args.command in ("promote", "rollback"):
        print(shown(versions.promote(args.version) if args.command == "promote"
                    else versions.rollback()))
        return
    if args.command == "export":
        bench = benchmark_of(args.checkpoint)
        report = args.report
        if report is None and bench is not None:
            report = Path("metrics") / f"{bench}_report.json"
        refuse_inside(args.out, "--out", {"the checkpoint": args.checkpoint,
                                          "--relations": args.relations, "--report": report})
        check_out(args.out, args.force)  # before reading the checkpoint
        if args.report is not None or (report is not None and report.exists()):
            check_report(report)  # a report asked for (or found) must be one
        out = export(loader.read(args.checkpoint), args.checkpoint, args.out,
                     args.relations, report, bench, with_encoder=not args.no_encoder,
                     force=args.force)
        print(f"exported {shown(args.checkpoint)} -> {shown(out)} (use: regrab-predict "
              f"--checkpoint {shown(out)})")
        return
    out = args.out
    if out is None:
        stem = {"model.pt": MODEL_FILE, "state.pt": STATE_FILE}.get(args.old.name)
        out = args.old.with_name(stem) if stem else args.old.with_suffix(".safetensors")
    refuse_same(out, "--out", {"the file being converted": args.old})
    check_writable(out, "--out")
    with atomic_path(out) as tmp:
        fmt = convert_legacy(args.old, tmp)
        if out.exists() and not args.force and not filecmp.cmp(tmp, out, shallow=False):
            raise PipelineError(
                f"--out {out} already exists and holds something else than this conversion; "
                "convert never replaces a file it did not write: give another --out, move "
                "that file away, or add --force to replace it")
    print(f"converted {shown(args.old)} -> {shown(out)} ({fmt}); the pickle was left as it "
          "is, delete it once the new file works")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: bad input ends in one ``error:`` line (exit 2), not a traceback;
    Ctrl-C exits 130, SIGTERM 143, leaving no temporary folder behind."""
    run_command(run, argv)


if __name__ == "__main__":
    main()
