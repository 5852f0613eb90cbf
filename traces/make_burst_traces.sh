#!/usr/bin/env bash
# Records the burst-plan (DeepPool) rows of the validation matrix: gpt2-cpu on one emulated node with two ranks
# (cpu-1x2), batch 8, two plans written beside their traces:
#   gpt2-cpu-1x2-burst-ends1-bulk-B8.plan.yaml  embedding and LM head on rank 0, the transformer layers on both, bulk
#   gpt2-cpu-1x2-burst-emb1-wfbp-B8.plan.yaml   only the embedding on rank 0, WFBP (the tied copies all-reduced)
# It profiles the plans' events first (compute at each shard size, the re-distributions' p2p sizes, the per-layer
# all-reduces: `distsim profile --plan`), right before running them (this VM's speed drifts over tens of minutes),
# then executes each with that profile recorded in the trace. `distsim validate --suite traces` includes them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p profiles/validation
ITER=(--iterations 10 --warmup 2)
LAUNCH=(--emulate-nodes 1 --procs-per-node 2)
profile=profiles/validation/gpt2-cpu-1x2-burst.json
plans=(traces/gpt2-cpu-1x2-burst-ends1-bulk-B8.plan.yaml traces/gpt2-cpu-1x2-burst-emb1-wfbp-B8.plan.yaml)
args=()
for plan in "${plans[@]}"; do args+=(--plan "$plan"); done
python3 -m distsim profile "${args[@]}" "${LAUNCH[@]}" --max-comm-bytes 64MiB --repeats 20 --overwrite \
  --out "$profile"
for plan in "${plans[@]}"; do
  trace="${plan%.plan.yaml}.json"
  python3 -m distsim execute --plan "$plan" "${LAUNCH[@]}" --profile "$profile" "${ITER[@]}" --out "$trace"
  python3 -m distsim validate --trace "$trace"
done
