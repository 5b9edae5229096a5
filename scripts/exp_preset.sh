#!/usr/bin/env bash
# Run a preset (a partial params file such as params-gpu-mpnet.yaml) as a DVC experiment, so
# its metrics, params and code version sit in `dvc exp show` beside the CPU default.
#   scripts/exp_preset.sh params-gpu-mpnet.yaml [dvc exp run options: --queue, --temp, -S ...]
# The preset's keys become `-S key=value` arguments (python -m orchestration.overrides, which
# checks every key against params.yaml); params.yaml itself is not edited. The experiment is
# named after the preset (params-gpu-mpnet.yaml -> gpu-mpnet), or NAME. Options after the
# preset go to `dvc exp run` unchanged, after the preset's -S, so they win. DVC names the
# `dvc` to run; PYTHON the interpreter (default python3).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 PRESET.yaml [dvc exp run options]" >&2; exit 2; }
preset=$1
shift
name=$(basename "$preset" .yaml)
name=${NAME:-${name#params-}}
# No value holds whitespace (the helper refuses one), so splitting on it is exact.
sets=$("${PYTHON:-python3}" -m orchestration.overrides "$preset")
read -ra sets <<<"$sets"
exec ${DVC:-dvc} exp run --name "$name" "${sets[@]}" "$@"
