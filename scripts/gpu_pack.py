"""Pack what the NYT-25 table on a lent GPU needs, for scripts/gpu_table.py to run there.

    python scripts/gpu_pack.py [--encoder mpnet] [--preset params-gpu-mpnet.yaml]   # make gpu-pack

exports the encoder in fp16 (scripts/export_encoder_fp16.py; after `make encoder-mpnet`), cuts
it into folders that each fit one device call beside the working tree
(scripts/carry_parts.sh), copies the NYT-25 data stages' outputs (splits, graph, TransE
features, relation labels, and FewRel's relation names and descriptions, which evaluation
reads; after `dvc checkout`) and the code version into ``.gpu/main``, and prints the device
calls: each carries one ``.gpu/part<i>`` (the last one also ``.gpu/main``) and runs the same
command (docs/performance.md#gpu).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
#: What one device call carries at most, working tree included.
CALL_LIMIT = 64 * MIB
#: The NYT-25 data stages' outputs the table reads, relative to the data folder.
DATA = ("splits", "graph/graph.parquet", "features/transe.parquet",
        "wikidata/relations.parquet", "raw/fewrel/pid2name.json")
CODE = ("model", "pipeline", "stages", "cli", "benchmarks", "scripts", "orchestration")
#: The most parts an encoder is cut into (carry_parts.sh numbers them with two digits).
MAX_PARTS = 100
#: The command every device call runs.
COMMAND = "PYTHONPATH=$PWD python3 scripts/gpu_table.py --budget {budget} --out $OUT"


def die(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def code_digest(root: Path) -> str:
    """sha256 over the code and params files (the same here and on a machine without git)."""
    h = hashlib.sha256()
    files = [p for d in CODE for p in (root / d).rglob("*")
             if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts]
    files += sorted(root.glob("params*.yaml"))
    for p in sorted(files):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def git(*args: str) -> str:
    res = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return res.stdout.strip() if res.returncode == 0 else ""


def tree_bytes() -> int:
    """What every device call carries besides ``carry``: tracked and untracked-not-ignored
    files of the checkout."""
    names = git("ls-files", "-co", "--exclude-standard", "-z").split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())



def check_args(args: argparse.Namespace) -> None:
    """Stop with one line, before anything is made, on a value pack would fail on later."""
    from model.encoder.files import resolve_encoder_path
    from pipeline.errors import PipelineError

    dest = args.dest
    if os.path.lexists(dest):
        die(f"{dest} exists; remove it (rm -rf {dest}) or pass --dest")
    if args.part_size < 0:
        die(f"--part-size {args.part_size} must be a number of bytes (0: what fits one call)")
    if args.budget <= 0:
        die(f"--budget {args.budget} must be a positive number of seconds")
    try:
        source = Path(args.encoder) if args.no_export else Path(
            resolve_encoder_path(args.encoder, local_only=True))
    except PipelineError as exc:
        die(f"--encoder {args.encoder} is not an encoder here ({exc})")
    if not (source / "config.json").is_file() or (
            args.no_export and not (source / "model.safetensors").is_file()):
        die(f"--encoder {args.encoder} is not an encoder here (no folder with config.json"
            f"{' and model.safetensors' if args.no_export else ''}); pass minilm, mpnet "
            "(after `make encoder-mpnet`) or an encoder folder")
    for rel in DATA:
        if not (args.data / rel).exists():
            die(f"{args.data / rel} not found; run `dvc checkout` or `dvc repro split_nyt "
                "build_graph` first")
    if not (ROOT / ".gitignore").read_text().count("/.gpu/") and dest.resolve().parent == ROOT:
        die("add /.gpu/ to .gitignore first, so the bundle travels only where it is carried")


def pack(args: argparse.Namespace) -> None:
    """:func:`check_args`, then the bundle in ``--dest``: whole, or (a failure, Ctrl-C) not
    at all."""
    check_args(args)
    try:
        args.dest.mkdir(parents=True)
    except OSError as exc:
        die(f"--dest {args.dest} cannot be made ({exc.strerror or type(exc).__name__}); give "
            "a folder you can write to")
    try:
        _pack(args)
    except BaseException:
        shutil.rmtree(args.dest, ignore_errors=True)
        raise


def _run(cmd: list[str], what: str, **kwargs: object) -> None:
    """Run a helper; its failure ends pack with one line (its own ``error:`` line, if any)."""
    res = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, check=False,
                         **kwargs)
    if res.returncode != 0:
        said = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
        die(f"{what} failed (exit {res.returncode})"
            + (f": {said[-1][len('error: '):]}" if said else f"; {res.stderr.strip()[-300:]}"))


def _pack(args: argparse.Namespace) -> None:
    dest = args.dest
    encoder = dest / "encoder"
    if args.no_export:
        shutil.copytree(args.encoder, encoder)
    else:
        _run([sys.executable, str(ROOT / "scripts" / "export_encoder_fp16.py"),
              args.encoder, str(encoder)], "the encoder's fp16 export")
    main = dest / "main"
    for rel in DATA:
        src, dst = args.data / rel, main / "data" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    tree = tree_bytes()
    weights = (encoder / "model.safetensors").stat().st_size
    small = folder_bytes(encoder) - weights
    room = CALL_LIMIT - tree - MIB  # a part call: the tree, one part and a margin
    if room < 4 * MIB:
        die(f"the working tree is {tree / MIB:.1f} MiB; a device call carries 64 MiB in all")
    part = args.part_size or (room - small) // MIB * MIB
    if -(-weights // part) > MAX_PARTS:
        die(f"--part-size {part} cuts the {weights / MIB:.1f} MiB encoder into more than "
            f"{MAX_PARTS} parts (one device call each); give at least {-(-weights // MAX_PARTS)} "
            "bytes, or leave --part-size out")
    if part > room - small:
        die(f"--part-size {part} does not fit one device call beside the {tree / MIB:.1f} MiB "
            f"working tree; give at most {room - small} bytes, or leave --part-size out")
    _run(["bash", str(ROOT / "scripts" / "carry_parts.sh"), "split", str(encoder),
          str(dest / "part")], "cutting the encoder into parts",
         env={**os.environ, "PART_SIZE": str(part)})
    parts = sorted(dest.glob("part[0-9]*"), key=lambda p: int(p.name[4:]))
    for p in parts:
        (p / "PARTS").write_text(f"{len(parts)}\n")
    version = {"commit": git("rev-parse", "HEAD"), "branch": git("rev-parse", "--abbrev-ref",
                                                                   "HEAD"),
               "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
               "code_sha256": code_digest(ROOT), "packed": datetime.now(UTC).isoformat(
                   timespec="seconds"),
               "encoder": args.encoder, "presets": [str(p) for p in args.preset]}
    (main / "version.json").write_text(json.dumps(version, indent=1) + "\n")
    shutil.rmtree(encoder)
    calls = [[str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)] for p in parts]
    main_rel = str(main.relative_to(ROOT) if main.is_relative_to(ROOT) else main)
    if tree + folder_bytes(parts[-1]) + folder_bytes(main) + MIB <= CALL_LIMIT:
        calls[-1].append(main_rel)
    else:
        calls.append([main_rel])
    plan = {"calls": calls, "tree_mib": round(tree / MIB, 1),
            "sizes_mib": {str(p.name): round(folder_bytes(p) / MIB, 1) for p in [*parts, main]}}
    (dest / "calls.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(f"{dest}: {len(parts)} encoder part(s), data and version; working tree "
          f"{tree / MIB:.1f} MiB. Device calls, each within 30 s of the last:")
    for i, carry in enumerate(calls, 1):
        print(f"  {i}. carry {json.dumps(carry)}; command: "
              + COMMAND.format(budget=args.budget))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--encoder", default="mpnet", help="minilm, mpnet or an encoder folder")
    p.add_argument("--no-export", action="store_true",
                   help="carry --encoder (a folder) as it is, without the fp16 export")
    p.add_argument("--data", type=Path, default=ROOT / "data")
    p.add_argument("--dest", type=Path, default=ROOT / ".gpu")
    p.add_argument("--preset", type=Path, action="append", default=[],
                   help="partial params file(s) the run applies (default "
                        "params-gpu-mpnet.yaml)")
    p.add_argument("--budget", type=int, default=450, help="printed into the commands")
    p.add_argument("--part-size", type=int, default=0,
                   help="bytes per encoder part (default: what fits one call)")
    args = p.parse_args(argv)
    args.preset = args.preset or [Path("params-gpu-mpnet.yaml")]
    pack(args)


if __name__ == "__main__":
    main()
