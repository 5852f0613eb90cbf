#!/usr/bin/env bash
# Records the issue-12 traces of the validation matrix (traces/make_cpu_traces.sh runs this too): gpt2-cpu on one
# emulated node with two ranks, full activation recomputation under 1F1B (M=4), and ZeRO-1 over two data-parallel
# ranks (M=4: the bulk bucket reduce-scattered, Adam on each rank's half, the parameters all-gathered). Their own
# profile first, right before them: its strategies carry the fields, so it also measures the reduce-scatter, the
# all-gather and the half-size optimizer step ZeRO-1 runs. 2 traces, a few minutes on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ITER=(--iterations 10 --warmup 2)
launch=(--cluster cpu-1x2 --emulate-nodes 1 --procs-per-node 2)
profile=profiles/validation/gpt2-cpu-1x2-scale.json
python3 -m distsim profile --model gpt2-cpu "${launch[@]}" --strategy "tp=1 pp=2 dp=1 recompute=full" \
  --strategy "tp=1 pp=1 dp=2 zero=zero1" --schedule 1f1b --micro-batches 4 --max-comm-bytes 256MiB --repeats 20 \
  --overwrite --out "$profile"
for case in "1M2P1D-1f1b-M4-recompute-full --strategy 1M2P1D --schedule 1f1b --recompute full" \
            "1M1P2D-zero1-M4 --strategy 1M1P2D --optimizer-sharding zero1"; do
  read -r name options <<< "$case"
  # shellcheck disable=SC2086  # the options split into words
  python3 -m distsim execute --model gpt2-cpu "${launch[@]}" --profile "$profile" "${ITER[@]}" --micro-batches 4 \
    --out "traces/gpt2-cpu-1x2-$name.json" $options
done
for name in 1M2P1D-1f1b-M4-recompute-full 1M1P2D-zero1-M4; do
  python3 -m distsim validate --trace "traces/gpt2-cpu-1x2-$name.json"
done
