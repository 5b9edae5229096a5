#!/usr/bin/env bash
# Train and evaluate NYT-25 with the GPU preset (or, with PRESET=none, the CPU default)
# without DVC, e.g. on a lent GPU machine that has torch but no dvc. Needs data/splits,
# data/graph/graph.parquet, data/features/transe.parquet and data/wikidata/relations.parquet
# from `dvc repro build_graph split_nyt` (or GRAPH, FEATURES and RELATIONS) and, optionally,
# an encoder folder (ENCODER).
#   ENCODER=.enc/minilm OUT_DIR=/tmp/gpu [MODELS_DIR=...] bash scripts/run_preset.sh [params]
set -euo pipefail
OUT_DIR=${OUT_DIR:-/tmp/gpu_preset}
MODELS_DIR=${MODELS_DIR:-$OUT_DIR/models}
mkdir -p "$OUT_DIR"
PRESET=${PRESET:-params-gpu.yaml}   # PRESET=none: the CPU default (params.yaml alone)
NAME=${NAME:-nyt25_gpu}
[ "$PRESET" = none ] && PRESET="" && NAME=${NAME/_gpu/}
"${PYTHON:-python3}" - "$OUT_DIR/params.yaml" "$PRESET" "${1:-}" <<'PY'
import os
import sys

import yaml

from pipeline.config import merged

out, *profiles = sys.argv[1:]
params = yaml.safe_load(open("params.yaml"))
for p in profiles:
    if p:
        params = merged(params, yaml.safe_load(open(p)) or {})
if os.environ.get("ENCODER"):
    params["model"]["encoder"]["name"] = os.environ["ENCODER"]
yaml.safe_dump(params, open(out, "w"))
PY
"${PYTHON:-python3}" -m stages.train --splits data/splits \
  --graph "${GRAPH:-data/graph/graph.parquet}" \
  --features "${FEATURES:-data/features/transe.parquet}" \
  --relations "${RELATIONS:-data/wikidata/relations.parquet}" \
  --out "$MODELS_DIR" --params "$OUT_DIR/params.yaml"
"${PYTHON:-python3}" -m stages.evaluate --splits data/splits --models "$MODELS_DIR" \
  --metrics "$OUT_DIR/$NAME.json" --table "$OUT_DIR/$NAME.md" \
  --plot "$OUT_DIR/$NAME.png" --params "$OUT_DIR/params.yaml"
