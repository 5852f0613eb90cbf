#!/usr/bin/env bash
# Records the mixture-of-experts traces of the validation matrix: moe-cpu (Mixtral-style layers of 4 experts,
# top-2, each expert on every rank; grouped-query attention with 2 key/value heads of 8, SwiGLU, RMSNorm, rotary
# positions, untied output layer, no biases; CPU-sized, fp32) on one emulated node with two ranks: 2P under GPipe and 1F1B and 2D with bulk and overlapped (WFBP) gradient sync, M=4. Its own profile first,
# right before them. 4 traces, a few minutes on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ITER=(--iterations 10 --warmup 2)
launch=(--cluster cpu-1x2 --emulate-nodes 1 --procs-per-node 2)
profile=profiles/validation/moe-cpu-1x2.json
python3 -m distsim profile --model moe-cpu "${launch[@]}" --strategy 1M2P1D --strategy 1M1P2D --micro-batches 4 \
  --max-comm-bytes 256MiB --repeats 20 --overwrite --out "$profile"
for case in "1M2P1D-gpipe-M4 --strategy 1M2P1D --schedule gpipe" "1M2P1D-1f1b-M4 --strategy 1M2P1D --schedule 1f1b" \
            "1M1P2D-bulk-M4 --strategy 1M1P2D --grad-sync bulk" "1M1P2D-wfbp-M4 --strategy 1M1P2D --grad-sync wfbp"; do
  read -r name options <<< "$case"
  # shellcheck disable=SC2086  # the options split into words
  python3 -m distsim execute --model moe-cpu "${launch[@]}" --profile "$profile" "${ITER[@]}" --micro-batches 4 \
    --out "traces/moe-cpu-1x2-$name.json" $options
done
for name in 1M2P1D-gpipe-M4 1M2P1D-1f1b-M4 1M1P2D-bulk-M4 1M1P2D-wfbp-M4; do
  python3 -m distsim validate --trace "traces/moe-cpu-1x2-$name.json"
done
