"""Seconds to refuse a bad params value, against the seconds to import torch, side by side.

Each row is a fresh interpreter (``python ...`` in a subprocess, as a user runs it), timed
from start to exit, ``--repeat`` times; the table gives the median and the fastest. The peer
is ``import torch`` alone: the schemas import no torch, so a refusal should cost a fraction
of it, however busy the machine (the load average is printed with the table, since every
row slows with it).

* ``-S <bad model value>``, ``-S <bad train value>``, ``-S split_nyt.seeds=[]``: the
  Prefect flow's check of its overrides (``python -m orchestration.flows``), which ends
  before Prefect is imported;
* ``check_params stage, bad value``: the stage ``dvc exp run -S`` runs first, on a params
  file with the same bad model value;
* ``-S <good value>, every check``: a valid override, so every section and every check
  across sections runs; the Langevin time check imports torch and times a chain, so this
  row costs more than the peer.

Usage:
    python benchmarks/bench_params_check.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def wall_s(args: list[str], expect: int) -> float:
    """Seconds ``python ARGS`` takes, start to exit; its exit status must be ``expect``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    took = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}, not {expect}: "
                         f"{done.stderr[-500:]}")
    return took


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each row (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-params-") as tmp:
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["model"]["langevin"]["steps"] = -1
        bad = Path(tmp) / "params.yaml"
        bad.write_text(yaml.safe_dump(params, sort_keys=False))
        flow = ["-m", "orchestration.flows", "-S"]
        rows = [
            ("import torch (the peer)", ["-c", "import torch"], 0),
            ("-S model.langevin.steps=-1", [*flow, "model.langevin.steps=-1"], 2),
            ("-S model.prior.kind=bogus", [*flow, "model.prior.kind=bogus"], 2),
            ("-S train.device=tpu", [*flow, "train.device=tpu"], 2),
            ("-S split_nyt.seeds=[]", [*flow, "split_nyt.seeds=[]"], 2),
            ("check_params stage, bad value",
             ["-m", "stages.check_params", "--params", str(bad), "--out", f"{tmp}/out"], 2),
            ("-S train.steps=301, every check",
             ["-c", "from orchestration.flow_command import check_overrides; "
                    "check_overrides(['-S', 'train.steps=301'])"], 0),
        ]
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
              f"{args.repeat} run(s) per row, each a fresh interpreter")
        print(f"{'':34s} {'median s':>9s} {'fastest s':>10s}")
        for name, command, expect in rows:
            times = [wall_s(command, expect) for _ in range(args.repeat)]
            print(f"{name:34s} {statistics.median(times):9.2f} {min(times):10.2f}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
