"""The NYT-25 table on one lent GPU: packed here, run there with one command.

Here, ``python scripts/gpu_pack.py`` (make gpu-pack) makes the bundle and prints the device
calls; each carries a part of it and runs, within 30 s of the last so the machine stays warm:

    PYTHONPATH=$PWD python3 scripts/gpu_table.py --budget 450 --out $OUT

A call whose parts are not all there yet keeps the part it brought under ``--work`` (/tmp
stays while the machine is warm) and stops. Once every part is there it joins the encoder
and checks its sha256, measures seconds per training step on the first steps of one model
and prints them, chooses the steps per model that fit the budget, trains regrab,
proto_label, regrab_no_prior and proto on every NYT-25 split with the GPU preset (one split
per stage call, starting none that would not end in time), evaluates them on the default's
episodes, runs benchmarks/bench_train.py if time is left, and writes to ``--out`` the
metrics (.json, .md, report), the params used, run.json (code version, device, timings,
the calibration and the plan) and the log. A rerun on the warm machine reuses the finished
models. Needs torch, transformers, torch-geometric and pyarrow only; runs from the repository
root with PYTHONPATH set to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_pack import DATA, ROOT, code_digest, die  # noqa: E402  (a sibling script)

METHODS = ("regrab", "proto_label", "regrab_no_prior", "proto")


class Log:
    """Print and keep every line (the log travels back in ``--out``)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        line = f"[gpu_table {time.perf_counter() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def receive(bundle: Path, work: Path, log: Log) -> Path | None:
    """Keep the parts this call brought; the joined encoder once every part is there."""
    encoder = work / "encoder"
    if (encoder / "model.safetensors").exists():
        return encoder
    parts = work / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for folder in sorted(bundle.glob("part[0-9]*")):
        for f in folder.iterdir():
            shutil.copy2(f, parts / f.name)
        log(f"received {folder.name}")
    have = sorted(p.name for p in parts.glob("model.safetensors.part*"))
    want = int((parts / "PARTS").read_text()) if (parts / "PARTS").exists() else None
    if want is None or len(have) < want or not (parts / "SHA256SUMS").exists():
        log(f"{len(have)} of {want or '?'} encoder parts under {parts}; carry the others "
            "(the same command) while the machine is warm")
        return None
    subprocess.run(["bash", str(ROOT / "scripts" / "carry_parts.sh"), "join", str(parts),
                    str(encoder)], check=True)
    (encoder / "PARTS").unlink(missing_ok=True)
    return encoder


def compose(out: Path, presets: list[Path], **changes: object) -> Path:
    """params.yaml with the presets laid over it (each key must be one of params.yaml) and
    ``changes`` (:func:`derive`). Not ``python -m orchestration.overrides --write``: its
    checks import packages a bare GPU machine lacks (Hydra, orjson); the stages check every
    section as they read it."""
    import yaml

    from pipeline.config import merged

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for preset in presets:
        part = yaml.safe_load(preset.read_text()) or {}
        stack = [((), part)]
        while stack:
            path, node = stack.pop()
            for key, value in node.items():
                where, cur = (*path, key), params
                for k in where:
                    cur = cur.get(k) if isinstance(cur, dict) else None
                if cur is None and not (isinstance(value, dict) and not value):
                    die(f"{preset}: {'.'.join(where)} is not a key of params.yaml; fix the "
                        "preset")
                if isinstance(value, dict):
                    stack.append((where, value))
        params = merged(params, part)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(yaml.safe_dump(params, sort_keys=False))
    tmp.rename(out)
    return derive(out, out, **changes)


def derive(src: Path, dst: Path, **changes: object) -> Path:
    """``src`` with a few keys changed (``train__steps=300`` sets train.steps), written
    atomically; the stages check them as they read the file."""
    import yaml

    params = yaml.safe_load(src.read_text())
    for key, value in changes.items():
        *path, name = key.split("__")
        node = params
        for k in path:
            node = node[k]
        node[name] = value
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.write_text(yaml.safe_dump(params, sort_keys=False))
    tmp.rename(dst)
    return dst


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def calibrate(params: Path, data: Path, steps: int, log: Log) -> dict[str, float]:
    """Seconds per training step of regrab on split_0 (median of the steps after the first
    two), and of what each model costs besides its steps: set-up, one validation, one state
    write; and of what each stage call costs before its models: imports and the graph."""
    t = time.perf_counter()
    import torch

    from model.config import ModelParams
    from model.encoder.frozen_cache import LowerCache
    from model.methods.registry import config_for_method
    from model.training.config import load_train
    from model.training.jobs import load_graph
    from model.training.loop import TokenCache, prepare, train_step, validate
    from model.training.state import save_state
    from pipeline.config import load_section, select_device, set_threads

    imports = time.perf_counter() - t
    cfg = load_train(params, "nyt25")
    set_threads(cfg.threads)
    device = select_device(cfg.device, "train.device")
    model_cfg = config_for_method(load_section(ModelParams, "model", params), "regrab")
    t = time.perf_counter()
    graph = load_graph(data / DATA[1], data / DATA[2], data / DATA[3])
    per_call = imports + time.perf_counter() - t
    t = time.perf_counter()
    run = prepare(data / "splits" / "split_0", "regrab", model_cfg, cfg, graph, device,
                  TokenCache(), LowerCache(), cfg.seed, (0, 0, 0))
    sync(device)
    setup = time.perf_counter() - t
    times = []
    run.model.train()
    for _ in range(steps):
        t = time.perf_counter()
        train_step(run)
        sync(device)
        times.append(time.perf_counter() - t)
        run.step += 1
    t = time.perf_counter()
    validate(run)
    sync(device)
    val = time.perf_counter() - t
    t = time.perf_counter()
    tmp = params.parent / "calibration_state.safetensors"
    save_state(run, tmp, {})
    tmp.unlink()
    save = time.perf_counter() - t
    step = statistics.median(times[2:] if len(times) > 4 else times)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    log(f"calibration on {name}: {step:.3f} s/step (median of steps 3-{steps} of "
        f"split_0/regrab; first two {times[0]:.2f} s, {times[1]:.2f} s), set-up "
        f"{setup:.1f} s, validation {val:.1f} s, state write {save:.1f} s; a stage call "
        f"{per_call:.1f} s before its first model (imports, graph)")
    del run
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"step_s": step, "first_steps_s": times[:2], "setup_s": setup,
            "validation_s": val, "state_write_s": save, "stage_call_s": per_call,
            "device": name}


def choose_steps(cal: dict[str, float], left: float, splits: int, methods: int, lo: int,
                 hi: int) -> tuple[int, float]:
    """The most steps per model (``lo``..``hi``) with which every split's stage call fits
    ``left`` seconds, and the estimated seconds per split. A call: imports and the graph,
    then per model its set-up, two validations plus the uncertainty measure at the end
    (about one more), a state write and a best-model write, and its steps."""
    fixed = cal["setup_s"] + 3 * cal["validation_s"] + 2 * cal["state_write_s"]
    per_model = (left / splits - cal["stage_call_s"]) / methods
    fit = math.floor((per_model - fixed) / cal["step_s"]) if per_model > 0 else 0
    steps = max(lo, min(hi, fit))
    return steps, cal["stage_call_s"] + methods * (fixed + steps * cal["step_s"])


def stage(module: str, log: Log, *argv: str) -> float:
    t = time.perf_counter()
    log(f"python -m {module} {' '.join(argv)}")
    res = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, check=False)
    if res.returncode != 0:
        die(f"{module} failed (exit {res.returncode}); see the log above")
    return time.perf_counter() - t


def check_args(args: argparse.Namespace) -> None:
    """Stop with one line on a value that would run for nothing or fail after the work: a
    budget or reserve that is not a finite number of seconds, too few steps, an unknown
    method (checked by name, without importing the methods)."""
    from model.methods.registry import check

    if not (math.isfinite(args.budget) and args.budget > 0):
        die(f"--budget {args.budget} must be a positive number of seconds")
    for flag in ("eval_reserve", "bench_reserve", "margin"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value >= 0):
            die(f"--{flag.replace('_', '-')} {value} must be a number of seconds, 0 or more")
    if args.calibration_steps < 3:  # two warm-up steps, then at least one measured
        die(f"--calibration-steps {args.calibration_steps} must be 3 or more")
    if args.min_steps < 1 or args.max_steps < 0:
        die(f"--min-steps {args.min_steps} must be 1 or more and --max-steps "
            f"{args.max_steps} 0 (the preset's) or more")
    try:
        check(args.methods, "--methods")
    except ValueError as exc:
        die(str(exc))


def make_folders(folders: dict[str, Path]) -> None:
    """``mkdir -p`` each of ``{flag: folder}``, or one line saying which cannot be made (the
    folders made before it are removed again)."""
    made: list[Path] = []
    for flag, path in folders.items():
        if not path.is_dir():
            made.append(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            for folder in made[:-1]:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            die(f"{flag} {path} cannot be made ({exc.strerror or type(exc).__name__}); give "
                "a folder you can write to")


def run(args: argparse.Namespace) -> None:
    check_args(args)
    out, work = args.out, args.work
    make_folders({"--out": out, "--work": work})
    log = Log(out / "log.txt")
    record: dict = {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                    "budget_s": args.budget}
    encoder = receive(args.bundle, work, log)
    if encoder is None:
        return
    main = args.bundle / "main"
    data = args.data or (main / "data" if (main / "data").is_dir() else ROOT / "data")
    for rel in DATA:
        if not (data / rel).exists():
            die(f"{data / rel} not found; carry the bundle's main folder (gpu_table.py pack)")
    version = json.loads((main / "version.json").read_text()) if (
        main / "version.json").exists() else {}
    digest = code_digest(ROOT)
    record["version"] = {**version, "code_sha256_here": digest,
                         "code_as_packed": version.get("code_sha256") == digest}
    presets = args.preset or [Path(p) for p in version.get("presets", [])] or [
        Path("params-gpu-mpnet.yaml")]
    methods = list(args.methods)
    base = compose(work / "params_base.yaml", presets, model__encoder__name=str(encoder),
                   train__methods=methods, evaluate__methods=methods, comparison__methods=[],
                   train__dvclive=False)
    import yaml

    with base.open() as f:
        base_train = yaml.safe_load(f)["train"]
    hi = args.max_steps or base_train["steps"]
    splits = sorted(p.name for p in (data / "splits").glob("split_*"))
    calib = derive(base, work / "params_calibration.yaml", train__steps=args.calibration_steps)
    t = time.perf_counter()
    cal = calibrate(calib, data, args.calibration_steps, log)
    record["calibration"] = {**cal, "seconds": round(time.perf_counter() - t, 1)}
    models = len(splits) * len(args.methods)
    train_left = args.budget - log.elapsed() - args.eval_reserve - args.margin
    steps, per_split = choose_steps(cal, train_left, len(splits), len(args.methods),
                                    args.min_steps, hi)
    log(f"plan: {models} models, {steps} steps each (at most {hi}), about {per_split:.0f} s "
        f"per split; {train_left:.0f} s for training, {args.eval_reserve:.0f} s kept for "
        "evaluation")
    record["plan"] = {"models": models, "steps": steps, "max_steps": hi,
                      "seconds_per_split": round(per_split, 1),
                      "training_budget_s": round(train_left, 1)}
    params = derive(base, work / "params.yaml", train__steps=steps,
                    train__val_every=math.ceil(steps / 2), train__checkpoint_every=steps)
    shutil.copy(params, out / "params.yaml")
    paths = ["--graph", str(data / DATA[1]), "--features", str(data / DATA[2]),
             "--relations", str(data / DATA[3])]
    deadline = args.budget - args.eval_reserve - args.margin
    trained, split_s = [], {}
    estimate = per_split
    for split in splits:
        if trained and log.elapsed() + estimate > deadline:
            log(f"not starting {split}: {log.elapsed():.0f} s + about {estimate:.0f} s would "
                f"pass {deadline:.0f} s; the table has {len(trained)} split(s)")
            break
        one = derive(params, work / "params_split.yaml", train__splits=[split])
        split_s[split] = round(stage("stages.train", log, "--splits", str(data / "splits"),
                                     *paths, "--out", str(work / "models"), "--params",
                                     str(one), "--benchmark", "nyt25"), 1)
        estimate = max(estimate, split_s[split])
        trained.append(split)
    record["train_s"] = split_s
    evaluated = derive(params, work / "params_eval.yaml", evaluate__splits=trained)
    shutil.copy(evaluated, out / "params.yaml")
    name = args.name
    record["evaluate_s"] = round(stage(
        "stages.evaluate", log, "--splits", str(data / "splits"), "--models",
        str(work / "models"), "--metrics", str(out / f"{name}.json"), "--table",
        str(out / f"{name}.md"), "--plot", str(work / f"{name}.png"), "--relations",
        str(data / DATA[4]), "--params", str(evaluated), "--benchmark", "nyt25"), 1)
    record["splits"] = trained
    left = args.budget - log.elapsed() - args.margin
    if left >= args.bench_reserve:
        record["bench_s"] = bench(encoder, data, presets, out / "bench_train.txt", left, log)
    else:
        log(f"{left:.0f} s left: benchmarks/bench_train.py skipped (needs "
            f"{args.bench_reserve:.0f} s)")
    record["total_s"] = round(log.elapsed(), 1)
    (out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    log(f"done in {record['total_s']:.0f} s: {', '.join(sorted(p.name for p in out.iterdir()))}")


def bench(encoder: Path, data: Path, presets: list[Path], out: Path, left: float,
          log: Log) -> float | None:
    """benchmarks/bench_train.py --device auto on the carried encoder, stopped at ``left``."""
    t = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--device", "auto",
           "--split", str(data / "splits" / "split_0"), "--encoder", str(encoder),
           "--threads", "0", *[a for p in presets for a in ("--preset", str(p))]]
    log(" ".join(cmd))
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=left,
                             check=False)
        text = res.stdout + res.stderr[-4000:]
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() + f"\nstopped after {left:.0f} s\n"
    out.write_text(text)
    for line in text.splitlines():
        log(f"bench: {line}")
    return round(time.perf_counter() - t, 1)


def main(argv: list[str] | None = None) -> None:
    r = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    r.add_argument("--budget", type=float, default=450,
                   help="seconds the whole command may take (default 450, under the 8 "
                        "minutes that leave room to rerun once)")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/regrab_gpu/out")))
    r.add_argument("--work", type=Path, default=Path("/tmp/regrab_gpu"),
                   help="parts, the joined encoder and the models (kept while warm)")
    r.add_argument("--bundle", type=Path, default=ROOT / ".gpu")
    r.add_argument("--data", type=Path, default=None,
                   help="default: the bundle's data, else ./data")
    r.add_argument("--preset", type=Path, action="append", default=[],
                   help="partial params file(s) over params.yaml (default: those packed)")
    r.add_argument("--methods", nargs="+", default=list(METHODS))
    r.add_argument("--name", default="nyt25_gpu_mpnet", help="stem of the metrics files")
    r.add_argument("--calibration-steps", type=int, default=12)
    r.add_argument("--min-steps", type=int, default=50)
    r.add_argument("--max-steps", type=int, default=0, help="default: the preset's train.steps")
    r.add_argument("--eval-reserve", type=float, default=120)
    r.add_argument("--bench-reserve", type=float, default=40)
    r.add_argument("--margin", type=float, default=20)
    run(r.parse_args(argv))


if __name__ == "__main__":
    main()
