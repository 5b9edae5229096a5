#!/usr/bin/env bash
# Run a preset (a partial params file such as params-gpu-mpnet.yaml) as a DVC experiment, so
# its metrics, params and code version sit in `dvc exp show` beside the CPU default.
#   scripts/exp_preset.sh params-gpu-mpnet.yaml [dvc exp run options: --queue, --temp, -S ...]
# The preset's keys become `-S key=value` arguments (python -m orchestration.overrides, which
# checks every key and value as the stages will read them, the options' -S too, before DVC
# runs anything); params.yaml itself is not edited. The experiment is
# named after the preset (params-gpu-mpnet.yaml -> gpu-mpnet), or NAME. Options after the
# preset go to `dvc exp run` unchanged, after the preset's -S, so they win. DVC names the
# `dvc` to run; PYTHON the interpreter (default python3).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 PRESET.yaml [dvc exp run options]" >&2; exit 2; }
preset=$1
shift
name=$(basename "$preset" .yaml)
name=${NAME:-${name#params-}}
# The user's -S options are checked with the preset (as every stage will read params.yaml),
# so `dvc exp run` refuses nothing after hours of upstream stages.
user_sets=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    -S | --set-param) user_sets+=(-S "${args[i + 1]:-}"); i=$((i + 1)) ;;
    --set-param=*) user_sets+=(-S "${args[i]#--set-param=}") ;;
  esac
done
if [ ${#user_sets[@]} -gt 0 ]; then
  "${PYTHON:-python3}" -m orchestration.overrides --check "$preset" "${user_sets[@]}"
fi
# No value holds whitespace (the helper refuses one), so splitting on it is exact. The helper
# checks the preset itself too.
sets=$("${PYTHON:-python3}" -m orchestration.overrides "$preset")
read -ra sets <<<"$sets"
exec ${DVC:-dvc} exp run --name "$name" "${sets[@]}" "$@"
