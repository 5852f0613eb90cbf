#!/usr/bin/env bash
# One GPU: profile Llama-style (GQA, SwiGLU, RMSNorm, rope), mixture-of-experts and GPT blocks with distsim's CUDA
# profiler (1M1P1D, M=4), then compare each compute event's measured time with the analytic kernel model and simulate
# the iteration both ways (benchmarks/gpu_blocks_compare.py). About 2 minutes on an H100.
#
#   OUT=results-dir bash benchmarks/gpu_blocks.sh
#
# simpy is often missing on GPU images without PyPI: carry its wheel in .whl/ (see benchmarks/gpu_validate.sh).
# Results of 2026-11-26 on one H100 80GB HBM3: benchmarks/results/h100-2026-11-26-blocks/.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-blocks-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
if ! python3 -c "import simpy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/simpy-*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
base=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('dgx-h200' if 'H200' in n else 'dgx-h100' if 'H100' in n else 'dgx-a100')")
cat > "$OUT/cluster-1gpu.yaml" <<YAML
base: $base
name: local-1gpu
nodes: 1
gpus_per_node: 1
YAML
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
for case in "llama3-8b:layers=2,seq=4096 1" "mixtral-8x7b:layers=1,seq=4096 1" "gpt3-1.3b:layers=2 2" "llama3-8b:layers=2,seq=4096,precision=bf16-mixed,kv_heads=32 1"; do
  read -r spec mbs <<< "$case"
  name=$(echo "$spec" | tr ':,=' '___')
  timeout 150 python3 -m distsim profile --model "$spec" --cluster "$OUT/cluster-1gpu.yaml" --strategy 1M1P1D \
    --micro-batch-size "$mbs" --micro-batches 4 --no-comm --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
    || echo "profile $spec failed: $(tail -3 "$OUT/$name.log")"
  timeout 60 python3 benchmarks/gpu_blocks_compare.py "$spec" "$OUT/cluster-1gpu.yaml" "$OUT/$name.json" "$mbs" >> "$OUT/compare.txt" 2>&1
  echo "== $spec" >> "$OUT/compare.txt"
done
cat "$OUT/compare.txt"
