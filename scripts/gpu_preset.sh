#!/usr/bin/env bash
# Train and evaluate the GPU preset without DVC (for a lent GPU machine that has torch but
# no dvc). Needs data/splits, data/graph/graph.parquet and data/features/transe.parquet from
# `dvc repro build_graph split_nyt` (or GRAPH and FEATURES), and an encoder folder (ENCODER,
# default: minilm).
#   ENCODER=.enc/minilm OUT_DIR=/tmp/gpu [MODELS_DIR=...] bash scripts/gpu_preset.sh [params]
set -euo pipefail
OUT_DIR=${OUT_DIR:-/tmp/gpu_preset}
MODELS_DIR=${MODELS_DIR:-$OUT_DIR/models}
mkdir -p "$OUT_DIR"
python3 - "$OUT_DIR/params.yaml" params-gpu.yaml "${1:-}" <<'PY'
import sys
import yaml

from tests.conftest import merged

out, *profiles = sys.argv[1:]
params = yaml.safe_load(open("params.yaml"))
for p in profiles:
    if p:
        params = merged(params, yaml.safe_load(open(p)) or {})
import os

if os.environ.get("ENCODER"):
    params["model"]["encoder"]["name"] = os.environ["ENCODER"]
yaml.safe_dump(params, open(out, "w"))
PY
python3 -m stages.train --splits data/splits --graph "${GRAPH:-data/graph/graph.parquet}" \
  --features "${FEATURES:-data/features/transe.parquet}" --out "$MODELS_DIR" --params "$OUT_DIR/params.yaml"
python3 -m stages.evaluate --splits data/splits --models "$MODELS_DIR" \
  --metrics "$OUT_DIR/nyt25_gpu.json" --table "$OUT_DIR/nyt25_gpu.md" \
  --plot "$OUT_DIR/nyt25_gpu.png" --params "$OUT_DIR/params.yaml"
