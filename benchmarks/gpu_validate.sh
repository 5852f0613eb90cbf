#!/usr/bin/env bash
# GPU validation matrix: profiles, executes and validates distsim plans on whatever CUDA machine this runs on, then
# prints the error table (`distsim validate --suite`).
#
#   bash benchmarks/gpu_validate.sh [OUT_DIR]        # default: gpu-validate-<date>-<time> in the current directory
#
# Rows, each profiled right before it is executed (its own profile, which its traces name):
#   one GPU         gpt2-345m and bert-large at micro-batch sizes 4 and 8, gpt3-1.3b at 1 and 2 (1M1P1D, M=4);
#                   a Hugging Face GPT-2 medium (24 layers, h=1024, seq 1024, bf16, micro-batch 8) through
#                   `distsim profile --torch-model` when this distsim has that option (else skipped, said so); executed
#                   by `distsim execute --torch-model` if that exists, else its prediction (`simulate --model
#                   PROFILE`) is compared with a plain training loop of the same module
#   two+ GPUs       also gpt2-345m at micro-batch size 4 as 2D, 2P and 2M (1M1P2D, 1M2P1D, 2M1P1D) over NCCL on two
#                   of them, launched with torchrun
# A row that fails (out of memory, say) is reported and the others still run. Everything goes under OUT_DIR:
# cluster-{1,2}gpu.yaml (this machine: the nearest DGX preset with the GPU's name and memory), profiles/, traces/,
# logs/ (each row's full output), validate.txt, validate.csv, validate.json.
# Environment: PYTHON (default python3), ITERATIONS (10), WARMUP (3), MICRO_BATCHES (4).
#
# Setup on the CUDA machine (distsim's core does not depend on torch, so nothing here replaces a CUDA build):
#   1. a CUDA build of torch: the command pytorch.org's install selector gives for your CUDA version, e.g.
#        pip install torch --index-url https://download.pytorch.org/whl/cu130
#      (many GPU images already have one: `python3 -c "import torch; print(torch.cuda.is_available())"`)
#   2. distsim's other dependencies (numpy, pandas, networkx, matplotlib, click, pyyaml, simpy): `pip install -e .`
#      from this repository, or nothing if the image has them; this script runs `python -m distsim` from this
#      checkout (it puts the repository on PYTHONPATH), so distsim itself need not be installed.
#   3. simpy is often the one missing on GPU images, and such machines often cannot reach PyPI. It is pure Python:
#      carry its wheel. On a machine with PyPI, in this repository:
#        python3 -m pip download --no-deps --only-binary=:all: -d .whl "simpy>=4.1,<5"
#      then on the GPU machine:
#        python3 -m pip install --no-index --no-deps --target /tmp/site .whl/simpy-*.whl
#        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
#   4. transformers, only for the Hugging Face row (skipped with a message without it).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
ITERATIONS=${ITERATIONS:-10}
WARMUP=${WARMUP:-3}
M=${MICRO_BATCHES:-4}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null \
  | tail -n 1)
if ! [[ "$GPUS" =~ ^[0-9]+$ ]] || [ "$GPUS" -lt 1 ]; then
  echo "gpu_validate.sh: refusing to run: no CUDA device visible to $PY (torch missing, a CPU build, or no GPU)" >&2
  exit 2
fi
if ! "$PY" -c 'import simpy' 2>/dev/null; then
  echo "gpu_validate.sh: refusing to run: simpy is missing for $PY (carry its wheel: see the top of this script)" >&2
  exit 2
fi

OUT=${1:-gpu-validate-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/profiles" "$OUT/traces" "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
FAILED=()

# This machine as a cluster file: the nearest DGX preset (network figures, used only where nothing was measured),
# with the GPU's own name and memory (execute refuses plans the memory model says do not fit).
"$PY" - "$OUT" <<'EOF' || exit 2
import json, sys, torch
out = sys.argv[1]
props = torch.cuda.get_device_properties(0)
base = ("dgx-h200" if "H200" in props.name  # its own memory bandwidth (4.8 TB/s), not the H100's
        else "dgx-h100" if any(x in props.name for x in ("H100", "H800")) else "dgx-a100")
for n in (1, 2):
    with open(f"{out}/cluster-{n}gpu.yaml", "w") as f:
        f.write(f"base: {base}\nname: local-{n}gpu\nnodes: 1\ngpus_per_node: {n}\n"
                f"gpu:\n  name: {json.dumps(props.name)}\n  memory_bytes: {props.total_memory}\n")
print(f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB, L2 "
      f"{props.L2_cache_size / 2**20:.0f} MiB), torch {torch.__version__}; cluster files based on {base}")
EOF
echo "output in $OUT"

fail() {  # row, step
  echo "   FAILED: $1 $2 (see logs/$1.log)"
  FAILED+=("$1 $2")
}

row() {  # name ranks model_args... -- strategies...   (model_args: --model X --micro-batch-size B)
  local name=$1 ranks=$2
  shift 2
  local model_args=() strategies=()
  while [ "$1" != "--" ]; do model_args+=("$1"); shift; done
  shift
  strategies=("$@")
  local cluster="$OUT/cluster-${ranks}gpu.yaml" profile="$OUT/profiles/$name.json" log="$OUT/logs/$name.log"
  local launch=("$PY" -m distsim)
  if [ "$ranks" -gt 1 ]; then
    launch=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$ranks" -m distsim)
  fi
  local st_args=()
  for st in "${strategies[@]}"; do st_args+=(--strategy "$st"); done
  echo "== $name (${strategies[*]})"
  local t0=$SECONDS
  if ! "${launch[@]}" profile "${model_args[@]}" --cluster "$cluster" "${st_args[@]}" --micro-batches "$M" \
      --out "$profile" --overwrite >>"$log" 2>&1; then
    fail "$name" profile
    return
  fi
  grep -h "self-check:\|warning:" "$log" | sed 's/^/   /'
  for st in "${strategies[@]}"; do
    if ! "${launch[@]}" execute "${model_args[@]}" --cluster "$cluster" --strategy "$st" --micro-batches "$M" \
        --profile "$profile" --iterations "$ITERATIONS" --warmup "$WARMUP" \
        --out "$OUT/traces/$name-$st.json" >>"$log" 2>&1; then
      fail "$name" "execute $st"
    fi
  done
  echo "   $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------------------------------ one GPU
for spec in gpt2-345m:4 gpt2-345m:8 bert-large:4 bert-large:8 gpt3-1.3b:1 gpt3-1.3b:2; do
  model=${spec%%:*} mbs=${spec##*:}
  row "$model-mbs$mbs" 1 --model "$model" --micro-batch-size "$mbs" -- 1M1P1D
done

# A Hugging Face GPT-2 medium through --torch-model (module:function returning (module, batch)). Where execute runs
# such a module too, its trace joins the suite; where it does not, the row compares `simulate --model PROFILE` with
# a plain training loop of the same module (M micro-batches forward and backward, one AdamW step; as hf_ref.py).
HF_RESULT=""
hf_row() {
  local name=hf-gpt2-medium cluster="$OUT/cluster-1gpu.yaml"
  local log="$OUT/logs/$name.log" profile="$OUT/profiles/$name.json" spec="$OUT/hf_gpt2_medium.py:gpt2_medium"
  echo "== $name (1M1P1D through --torch-model)"
  cat >"$OUT/hf_gpt2_medium.py" <<'PYEOF'
"""Hugging Face GPT-2 medium (24 layers, h=1024, 16 heads, seq 1024, SDPA attention, bf16) and a micro-batch of 8.
`python hf_gpt2_medium.py M STEPS` prints the median seconds of a plain training step (M micro-batches, AdamW)."""
import statistics
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def gpt2_medium():
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024, vocab_size=50257,
                     attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (8, 1024))
    return GPT2LMHeadModel(cfg).to(torch.bfloat16), {"input_ids": ids, "labels": ids}


if __name__ == "__main__":
    micro_batches, steps = int(sys.argv[1]), int(sys.argv[2])
    model, batch = gpt2_medium()
    model = model.cuda().train()
    batch = {k: v.cuda() for k, v in batch.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(micro_batches):
            (model(**batch).loss / micro_batches).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(statistics.median(times[3:]))
PYEOF
  if ! "$PY" -m distsim profile --torch-model "$spec" --cluster "$cluster" --strategy 1M1P1D --micro-batches "$M" \
      --out "$profile" --overwrite >>"$log" 2>&1; then
    fail "$name" profile
    return
  fi
  grep -h "self-check:\|warning:" "$log" | sed 's/^/   /'
  if "$PY" -m distsim execute --help 2>/dev/null | grep -q -- "--torch-model"; then
    "$PY" -m distsim execute --torch-model "$spec" --cluster "$cluster" --strategy 1M1P1D --micro-batches "$M" \
      --profile "$profile" --iterations "$ITERATIONS" --warmup "$WARMUP" --out "$OUT/traces/$name-1M1P1D.json" \
      >>"$log" 2>&1 || fail "$name" "execute 1M1P1D"
    return
  fi
  local predicted measured
  predicted=$("$PY" -m distsim simulate --model "$profile" --cluster "$cluster" --strategy 1M1P1D \
    --micro-batches "$M" --json 2>>"$log" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["iteration_time_s"])') \
    || { fail "$name" simulate; return; }
  measured=$("$PY" "$OUT/hf_gpt2_medium.py" "$M" "$ITERATIONS" 2>>"$log" | tail -n 1) \
    || { fail "$name" "training loop"; return; }
  HF_RESULT=$("$PY" - "$predicted" "$measured" <<'PYEOF'
import sys
p, m = map(float, sys.argv[1:])
print(f"predicted {p * 1e3:.1f} ms, measured {m * 1e3:.1f} ms (plain training loop), error {100 * (p - m) / m:+.2f} %")
PYEOF
  )
  echo "   $HF_RESULT"
}
if ! "$PY" -m distsim profile --help 2>/dev/null | grep -q -- "--torch-model"; then
  echo "== hf-gpt2-medium: skipped: this distsim's profile has no --torch-model option"
elif ! "$PY" -c "import transformers" 2>/dev/null; then
  echo "== hf-gpt2-medium: skipped: transformers is not installed for $PY"
else
  hf_row
fi

# ------------------------------------------------------------------------------------------------- two GPUs, NCCL
if [ "$GPUS" -ge 2 ]; then
  row gpt2-345m-mbs4-2gpu 2 --model gpt2-345m --micro-batch-size 4 -- 1M1P2D 1M2P1D 2M1P1D
else
  echo "== 2D, 2P, 2M: skipped: one GPU"
fi

# --------------------------------------------------------------------------------------------------- error table
echo
echo "== error table: distsim validate --suite $OUT/traces (each trace against the profile it was run with)"
if ls "$OUT"/traces/*.json >/dev/null 2>&1; then
  "$PY" -m distsim validate --suite "$OUT/traces" --json >"$OUT/validate.json" 2>>"$OUT/logs/validate.log" \
    || FAILED+=("validate --json")
  "$PY" -m distsim validate --suite "$OUT/traces" --csv "$OUT/validate.csv" 2>>"$OUT/logs/validate.log" \
    | tee "$OUT/validate.txt" || FAILED+=("validate")
else
  echo "no traces were written"
fi
if [ -n "$HF_RESULT" ]; then
  echo "hf-gpt2-medium 1M1P1D M=$M: $HF_RESULT" | tee -a "$OUT/validate.txt"
fi
echo
echo "profiles' self-checks (isolated / in-situ compute time; distsim profile show FILE):"
for p in "$OUT"/profiles/*.json; do
  [ -e "$p" ] || continue
  printf '  %-28s %s\n' "$(basename "$p" .json)" \
    "$("$PY" -m distsim profile show "$p" 2>/dev/null | grep -m1 '^self-check' || echo '-')"
done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo
  echo "failed (${#FAILED[@]}): ${FAILED[*]}"
  exit 1
fi
