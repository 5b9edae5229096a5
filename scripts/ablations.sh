#!/usr/bin/env bash
# REGRAB ablations (docs/results/ablations.md): one regrab model per split for each variant,
# evaluated on the same episodes as the main run. Writes OUT_DIR/<variant>/. GPU preset by default;
# PRESET=none runs them on the CPU default.
#   ENCODER=.enc/minilm OUT_DIR=/tmp/abl bash scripts/ablations.sh [variant ...]
# The prior's rows (graph + label is the default; no prior is regrab_no_prior in the main run)
# also run as DVC experiments on both benchmarks, e.g.
#   dvc exp run -n label-only -S model.prior.kind=none -S 'train.methods=[regrab]' \
#     -S 'evaluate.methods=[regrab]' -S 'comparison.methods=[]'
#   dvc exp run -n graph-only -S model.prior.text=false (same -S for the methods)
set -euo pipefail
OUT_DIR=${OUT_DIR:-/tmp/ablations}
declare -A VARIANT=(
  [label_only]="model: {prior: {kind: none}}"
  [mlp_prior]="model: {prior: {kind: mlp}}"
  [graph_only]="model: {prior: {text: false}}"
  [mlp_graph_only]="model: {prior: {kind: mlp, text: false}}"
  [mix_fixed]="model: {prior: {mix: fixed}}"
  [wrong_priors]="train: {methods: [regrab], wrong_prior_rate: 0.25}"
  [official_graph]=""
  [no_noise]="model: {langevin: {noise_train: false, noise_eval: false}}"
  [dot]="model: {langevin: {similarity: dot}}"
  [steps_0]="model: {langevin: {steps: 0}}"
  [steps_1]="model: {langevin: {steps: 1}}"
  [steps_10]="model: {langevin: {steps: 10}}"
  [samples_1]="model: {langevin: {samples: 1}}"
  [samples_5]="model: {langevin: {samples: 5}}"
  [samples_20]="model: {langevin: {samples: 20}}"
  [no_eval_noise]="model: {langevin: {noise_eval: false}}"
  [learned_scales]="model: {langevin: {scales: learned}}"
  [paper_head]="model: {langevin: {likelihood: softmax_mean, similarity: dot, temperature: 10.0,
    prior_precision: 1.0, scales: fixed, noise_eval: false, step_size: 0.1,
    init_prior_weight: 1.0, init_mean_weight: 1.0}}"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(label_only graph_only mlp_prior mix_fixed official_graph no_noise)
for name in "${names[@]}"; do
  dir="$OUT_DIR/$name"; mkdir -p "$dir"
  {
    case "${VARIANT[$name]}" in train:*) ;; *) echo "train: {methods: [regrab]}" ;; esac
    echo "evaluate: {methods: [regrab], floor: false, nota_rates: []}"
    [ -n "${VARIANT[$name]}" ] && echo "${VARIANT[$name]}"
  } > "$dir/variant.yaml"
  graph=data/graph/graph.parquet; features=data/features/transe.parquet
  if [ "$name" = official_graph ]; then
    graph=${OFFICIAL_GRAPH:-data/graph_official/graph.parquet}
    features=${OFFICIAL_FEATURES:-data/features/official.parquet}
  fi
  start=$(date +%s)
  GRAPH=$graph FEATURES=$features OUT_DIR=$dir MODELS_DIR=${MODELS_ROOT:-/tmp/ablation_models}/$name \
    bash scripts/run_preset.sh "$dir/variant.yaml" > "$dir/log" 2>&1
  echo "$name: $(( $(date +%s) - start )) s"; grep "^| regrab |" "$dir"/nyt25*.md | head -1
done
