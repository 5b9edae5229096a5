#!/usr/bin/env bash
# Train and evaluate NYT-25 with the GPU preset (or, with PRESET=none, the CPU default)
# without DVC, e.g. on a lent GPU machine that has torch but no dvc. With DVC, run the preset
# as an experiment instead (scripts/exp_preset.sh params-gpu.yaml), so `dvc exp show` lists
# its metrics and params beside the CPU default. Needs data/splits,
# data/graph/graph.parquet, data/features/transe.parquet and data/wikidata/relations.parquet
# from `dvc repro build_graph split_nyt` (or GRAPH, FEATURES and RELATIONS) and, optionally,
# an encoder folder (ENCODER).
#   ENCODER=.enc/minilm OUT_DIR=/tmp/gpu [MODELS_DIR=...] bash scripts/run_preset.sh [params]
# DEADLINE_S=N trains one split at a time, starts no split after the first once N seconds
# have passed, and evaluates the splits it trained (for a lease that may not fit all five;
# the report names them). Models stay in MODELS_DIR, so a rerun resumes where it stopped.
set -euo pipefail
OUT_DIR=${OUT_DIR:-/tmp/gpu_preset}
MODELS_DIR=${MODELS_DIR:-$OUT_DIR/models}
mkdir -p "$OUT_DIR"
PRESET=${PRESET:-params-gpu.yaml}   # PRESET=none: the CPU default (params.yaml alone)
NAME=${NAME:-nyt25_gpu}
[ "$PRESET" = none ] && PRESET="" && NAME=${NAME/_gpu/}
# Every params file here is written by one helper, the one that gives `dvc exp run` its -S
# arguments (orchestration.overrides): same key checks, same value grammar.
write_params() {  # write_params OUT [--params SRC] [PRESET...] [-S key=value...]
  "${PYTHON:-python3}" -m orchestration.overrides --write "$@"
}
presets=()
for p in "$PRESET" "${1:-}"; do if [ -n "$p" ]; then presets+=("$p"); fi; done
write_params "$OUT_DIR/params.yaml" ${presets[@]+"${presets[@]}"} \
  ${ENCODER:+-S "model.encoder.name='$ENCODER'"}
train() {  # train [params file]
  "${PYTHON:-python3}" -m stages.train --splits data/splits \
    --graph "${GRAPH:-data/graph/graph.parquet}" \
    --features "${FEATURES:-data/features/transe.parquet}" \
    --relations "${RELATIONS:-data/wikidata/relations.parquet}" \
    --out "$MODELS_DIR" --params "${1:-$OUT_DIR/params.yaml}" --benchmark nyt25
}
set_splits() {  # set_splits SRC DST SECTION [SPLIT...]: DST is SRC with SECTION.splits set
  local src=$1 dst=$2 section=$3
  shift 3
  write_params "$dst" --params "$src" -S "$section.splits=[$(IFS=,; echo "$*")]"
}
if [ -n "${DEADLINE_S:-}" ]; then
  done_splits=()
  for dir in data/splits/split_*; do
    split=$(basename "$dir")
    if [ "${#done_splits[@]}" -gt 0 ] && [ "$SECONDS" -ge "$DEADLINE_S" ]; then
      echo "run_preset: ${SECONDS}s elapsed (DEADLINE_S=$DEADLINE_S): not starting $split" >&2
      break
    fi
    set_splits "$OUT_DIR/params.yaml" "$OUT_DIR/params_one.yaml" train "$split"
    train "$OUT_DIR/params_one.yaml"
    done_splits+=("$split")
  done
  # Evaluate exactly the splits trained here (not older models left in MODELS_DIR).
  set_splits "$OUT_DIR/params.yaml" "$OUT_DIR/params.yaml" evaluate "${done_splits[@]}"
else
  train
fi
"${PYTHON:-python3}" -m stages.evaluate --splits data/splits --models "$MODELS_DIR" \
  --metrics "$OUT_DIR/$NAME.json" --table "$OUT_DIR/$NAME.md" \
  --plot "$OUT_DIR/$NAME.png" --params "$OUT_DIR/params.yaml"
