#!/usr/bin/env bash
# Records four traces of the validation matrix for one CPU-sized model MODEL (llama-cpu, moe-cpu; see
# make_llama_traces.sh and make_moe_traces.sh) on one emulated node with two ranks: 2P under GPipe and 1F1B and 2D with
# bulk and overlapped (WFBP) gradient sync, M=4. Its own profile first (profiles/validation/MODEL-1x2.json), right
# before them. A few minutes on an idle machine.
#
#   bash traces/make_model_traces.sh MODEL
MODEL=${1:?usage: make_model_traces.sh MODEL (llama-cpu, moe-cpu)}
set -euo pipefail
cd "$(dirname "$0")/.."
ITER=(--iterations 10 --warmup 2)
launch=(--cluster cpu-1x2 --emulate-nodes 1 --procs-per-node 2)
profile=profiles/validation/$MODEL-1x2.json
python3 -m distsim profile --model "$MODEL" "${launch[@]}" --strategy 1M2P1D --strategy 1M1P2D --micro-batches 4 \
  --max-comm-bytes 256MiB --repeats 20 --overwrite --out "$profile"
for case in "1M2P1D-gpipe-M4 --strategy 1M2P1D --schedule gpipe" "1M2P1D-1f1b-M4 --strategy 1M2P1D --schedule 1f1b" \
            "1M1P2D-bulk-M4 --strategy 1M1P2D --grad-sync bulk" "1M1P2D-wfbp-M4 --strategy 1M1P2D --grad-sync wfbp"; do
  read -r name options <<< "$case"
  # shellcheck disable=SC2086  # the options split into words
  python3 -m distsim execute --model "$MODEL" "${launch[@]}" --profile "$profile" "${ITER[@]}" --micro-batches 4 \
    --out "traces/$MODEL-1x2-$name.json" $options
done
for name in 1M2P1D-gpipe-M4 1M2P1D-1f1b-M4 1M1P2D-bulk-M4 1M1P2D-wfbp-M4; do
  python3 -m distsim validate --trace "traces/$MODEL-1x2-$name.json"
done
