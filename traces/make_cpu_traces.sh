#!/usr/bin/env bash
# Reproduces traces/*.json and profiles/validation/*.json: the validation matrix measured on this project's
# 2-core development machine.
#
# For each CPU-sized zoo model and each layout (one emulated node with two ranks; two emulated nodes with a rank each,
# joined by a 1 Gbit/s shaped link, which needs root):
#   1. profile the events of the group's strategies right before running them (this VM's speed drifts by +-15 %
#      over tens of minutes, so a profile taken long before would mostly measure that drift);
#   2. execute every 2-rank strategy: 2P with GPipe and 1F1B at 2, 4 and 8 micro-batches; 2D with bulk and
#      per-layer overlapped (WFBP) gradient sync, and for gpt2-cpu and bert-cpu with DDP's buckets and MG-WFBP's
#      merged layers; 2M. The executor uses the partition (and the MG-WFBP merge plan) the simulator would with
#      that profile, and records the profile in the trace.
# traces/make_sync_traces.sh records only the DDP and MG-WFBP traces, with the profiles this script made;
# traces/make_scale_traces.sh (which this script runs) the recomputation and ZeRO-1 ones, with their own profile.
# Then `distsim validate --suite traces` predicts every trace with its own profile and prints the error table.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p profiles/validation
ITER=(--iterations 10 --warmup 2)
for model in gpt2-cpu bert-cpu t5-cpu; do
  for layout in 1x2 2x1; do
    if [ "$layout" = 1x2 ]; then launch=(--cluster cpu-1x2 --emulate-nodes 1 --procs-per-node 2)
    else launch=(--cluster cpu-2x1 --emulate-nodes 2 --procs-per-node 1 --link-bandwidth 1gbit); fi
    profile="profiles/validation/$model-$layout.json"
    strategies=(--strategy 1M2P1D --strategy 1M1P2D --strategy 2M1P1D)
    python3 -m distsim profile --model "$model" "${launch[@]}" "${strategies[@]}" --micro-batches 4 \
      --max-comm-bytes 256MiB --repeats 20 --overwrite --out "$profile"
    run() {  # name, then execute options
      local name=$1; shift
      python3 -m distsim execute --model "$model" "${launch[@]}" --profile "$profile" "${ITER[@]}" \
        --out "traces/$model-$layout-$name.json" "$@"
    }
    for schedule in gpipe 1f1b; do
      for m in 2 4 8; do run "1M2P1D-$schedule-M$m" --strategy 1M2P1D --schedule "$schedule" --micro-batches "$m"; done
    done
    for sync in bulk wfbp; do run "1M1P2D-$sync-M4" --strategy 1M1P2D --grad-sync "$sync" --micro-batches 4; done
    if [ "$model" != t5-cpu ]; then
      # DDP's buckets at 4 MiB: at DDP's default 25 MiB the fp32 gradients of gpt2-cpu (64 MiB) make only 3 buckets
      # and bert-cpu's (132 MiB) 5; at 4 MiB each makes 13, several of them splitting a layer
      run "1M1P2D-ddp-M4" --strategy 1M1P2D --grad-sync ddp --bucket-cap-mb 4 --micro-batches 4
      run "1M1P2D-mgwfbp-M4" --strategy 1M1P2D --grad-sync mgwfbp --micro-batches 4  # merge plan from the profile
    fi
    run "2M1P1D-M4" --strategy 2M1P1D --micro-batches 4
  done
done
# Issue 12 (gpt2-cpu, one node): full recomputation and ZeRO-1, with a profile of their own.
bash traces/make_scale_traces.sh
# Repeatability: the same plan five more times with the same profile, to measure this machine's own noise floor.
mkdir -p traces/repeat
for i in 1 2 3 4 5; do
  python3 -m distsim execute --model gpt2-cpu --cluster cpu-1x2 --emulate-nodes 1 --procs-per-node 2 \
    --profile profiles/validation/gpt2-cpu-1x2.json "${ITER[@]}" --strategy 1M2P1D --schedule 1f1b --micro-batches 4 \
    --out "traces/repeat/gpt2-cpu-1x2-1M2P1D-1f1b-M4-run$i.json"
done
python3 -m distsim validate --suite traces
python3 -m distsim validate --suite traces/repeat
