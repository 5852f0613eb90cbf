#!/usr/bin/env bash
# Records only the bucketed gradient-synchronisation traces of the validation matrix (traces/make_cpu_traces.sh
# records them too): for gpt2-cpu and bert-cpu on both layouts, 2D with DDP's buckets (4 MiB: at DDP's default
# 25 MiB these models' fp32 gradients make only 3 and 5 buckets; 4 MiB makes 13) and with MG-WFBP's merge plan,
# which `distsim execute` plans from the profile and records in the trace. 8 traces.
#
# It does not profile: it uses the profiles make_cpu_traces.sh wrote to profiles/validation/ (this VM's speed drifts
# by +-15 % over tens of minutes, so run it soon after them, or re-profile with that script).
set -euo pipefail
cd "$(dirname "$0")/.."
ITER=(--iterations 10 --warmup 2)
traces=()
for model in gpt2-cpu bert-cpu; do
  for layout in 1x2 2x1; do
    if [ "$layout" = 1x2 ]; then launch=(--cluster cpu-1x2 --emulate-nodes 1 --procs-per-node 2)
    else launch=(--cluster cpu-2x1 --emulate-nodes 2 --procs-per-node 1 --link-bandwidth 1gbit); fi
    profile="profiles/validation/$model-$layout.json"
    if [ ! -f "$profile" ]; then
      echo "make_sync_traces.sh: $profile is missing; traces/make_cpu_traces.sh profiles it" >&2
      exit 1
    fi
    run() {  # name, then execute options
      local name=$1; shift
      local out="traces/$model-$layout-$name.json"
      python3 -m distsim execute --model "$model" "${launch[@]}" --profile "$profile" "${ITER[@]}" --out "$out" "$@"
      traces+=("$out")
    }
    run "1M1P2D-ddp-M4" --strategy 1M1P2D --grad-sync ddp --bucket-cap-mb 4 --micro-batches 4
    run "1M1P2D-mgwfbp-M4" --strategy 1M1P2D --grad-sync mgwfbp --micro-batches 4
  done
done
for trace in "${traces[@]}"; do python3 -m distsim validate --trace "$trace"; done
