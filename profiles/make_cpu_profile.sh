#!/usr/bin/env bash
# Reproduces profiles/cpu-gloo.json: the shipped CPU profile of this project's 2-core development machine.
#
# Three small zoo variants (those the executor validation runs) are profiled twice:
#   1. one emulated node with two ranks (cpu-1x2): compute events (1 thread per rank) and intra-node collectives;
#   2. two emulated nodes with one rank each (cpu-2x1), joined by a veth pair shaped to 1 Gbit/s: inter-node
#      collectives and p2p (needs root for the network namespaces).
# Each run extends the same database; events already measured are not measured again.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-profiles/cpu-gloo.json}
MODELS=(
  gpt2-cpu   # gpt2-345m:hidden=512,heads=8,layers=4,seq=128,vocab=8192,precision=fp32
  bert-cpu   # bert-large:hidden=768,heads=12,layers=4,seq=64,vocab=8192,precision=fp32
  t5-cpu     # t5-base:layers=2,seq=64,dec_seq=32,vocab=8192,precision=fp32
)
COMMON=(--max-comm-bytes 64MiB --repeats 20)
for model in "${MODELS[@]}"; do
  for mbs in 1 2; do
    python3 -m distsim profile --model "$model" --cluster cpu-1x2 --strategy 1M2P1D --strategy 1M1P2D \
      --strategy 2M1P1D --micro-batches 4 --micro-batch-size "$mbs" --emulate-nodes 1 --procs-per-node 2 \
      --out "$OUT" "${COMMON[@]}"
  done
done
for model in "${MODELS[@]}"; do
  for mbs in 1 2; do
    python3 -m distsim profile --model "$model" --cluster cpu-2x1 --strategy 1M2P1D --strategy 1M1P2D \
      --micro-batches 4 --micro-batch-size "$mbs" --emulate-nodes 2 --procs-per-node 1 --link-bandwidth 1gbit \
      --out "$OUT" "${COMMON[@]}"
  done
done
python3 -m distsim profile show "$OUT"
