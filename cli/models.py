"""``regrab-models``: take a trained model away, or convert one written by an older version.

``export`` writes a train-stage checkpoint as a self-describing folder (weights, config,
relation labels and graph, the pre-trained encoder, a model card) that ``regrab-predict
--checkpoint DIR`` uses alone, with no project data and no ``params.yaml``.

``convert`` rewrites a pickle checkpoint of an older version (``model.pt``, ``state.pt``,
TransE's state) as safetensors + JSON. Loaders refuse pickles, because a pickle can run
code when it is loaded; convert only files whose origin you trust. (The pickle is read by
torch's restricted unpickler, which admits tensors and plain containers only.)

Usage:
    regrab-models export models/nyt25/split_0/regrab/model.safetensors --out my-model \
        [--relations data/wikidata/relations.parquet] [--report metrics/nyt25_report.json] \
        [--no-encoder]
    regrab-models convert models/nyt25/split_0/regrab/model.pt [--out model.safetensors]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from model.files.checkpoint import MODEL_FILE, STATE_FILE, convert_legacy, read_payload
from model.files.model_folder import export
from pipeline.errors import PipelineError, run_cli


def benchmark_of(checkpoint: Path) -> str | None:
    """``nyt25`` for ``models/nyt25/split_0/regrab/model.safetensors`` (None elsewhere)."""
    parts = checkpoint.resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part == "models" and i + 2 < len(parts) and parts[i + 2].startswith("split_"):
            return parts[i + 1]
    return None


def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="regrab-models", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write a checkpoint as a self-contained model folder")
    ex.add_argument("checkpoint", type=Path, help=f"a train-stage {MODEL_FILE}")
    ex.add_argument("--out", type=Path, required=True, help="the folder to write")
    ex.add_argument("--relations", type=Path, default=Path("data/wikidata/relations.parquet"),
                    help="relations table for the graph relations' labels (if present)")
    ex.add_argument("--report", type=Path, default=None,
                    help="metrics/<benchmark>_report.json for the model card (default: the "
                         "one of the checkpoint's benchmark, if present)")
    ex.add_argument("--no-encoder", action="store_true",
                    help="do not copy the pre-trained encoder (loading then needs it installed)")
    cv = sub.add_parser("convert", help="rewrite an older pickle checkpoint you trust")
    cv.add_argument("old", type=Path, help="model.pt, state.pt or a TransE state of an older "
                                           "version")
    cv.add_argument("--out", type=Path, default=None,
                    help=f"where to write (default: {MODEL_FILE} / {STATE_FILE} beside it)")
    args = parser.parse_args(argv)
    if args.command == "export":
        if args.out.exists() and not (args.out / "config.json").is_file():
            raise PipelineError(f"{args.out} exists and is not a model folder; give a new "
                                "--out folder (an existing model folder is replaced)")
        bench = benchmark_of(args.checkpoint)
        report = args.report
        if report is None and bench is not None:
            report = Path("metrics") / f"{bench}_report.json"
        out = export(read_payload(args.checkpoint), args.checkpoint, args.out,
                     args.relations, report, bench, with_encoder=not args.no_encoder)
        print(f"exported {args.checkpoint} -> {out} (use: regrab-predict --checkpoint {out})")
        return
    out = args.out
    if out is None:
        stem = {"model.pt": MODEL_FILE, "state.pt": STATE_FILE}.get(args.old.name)
        out = args.old.with_name(stem) if stem else args.old.with_suffix(".safetensors")
    if out.resolve() == args.old.resolve():
        raise PipelineError(f"--out {out} is the file being converted; give another path")
    fmt = convert_legacy(args.old, out)
    print(f"converted {args.old} -> {out} ({fmt}); the pickle was left as it is, delete it "
          "once the new file works")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: bad input ends in one ``error:`` line (exit 2), not a traceback."""
    run_cli(run, argv)


if __name__ == "__main__":
    main()
