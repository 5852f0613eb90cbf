#!/usr/bin/env bash
# GPU validation matrix: profiles, executes and validates distsim plans on whatever CUDA machine this runs on, then
# prints the error table (`distsim validate --suite`).
#
#   bash benchmarks/gpu_validate.sh [OUT_DIR]        # default: gpu-validate-<date>-<time> in the current directory
#
# Rows, each profiled right before it is executed (its own profile, which its traces name):
#   one GPU         gpt2-345m and bert-large at micro-batch sizes 4 and 8, gpt3-1.3b at 1 and 2 (1M1P1D, M=4);
#   torch models    the shipped `--torch-model` examples (examples/torch_models/, bf16): Hugging Face GPT-2 medium
#                   (micro-batch 8), a Hugging Face Llama-style 1.2B (GQA, SwiGLU; seq 2048, micro-batch 4),
#                   megatron-core GPTModel in GPT-2 medium (micro-batch 8) and GPT-3 1.3B (seq 2048, micro-batch 2)
#                   shapes, each also with full recomputation (a row NAME-recompute). Each model is profiled once
#                   through `distsim profile --torch-model` (without recomputation: the simulator adds the recomputed
#                   forward itself), predicted by `simulate --model PROFILE` for 1M1P1D with M micro-batches
#                   (`--recompute full` for the recompute rows) and measured by a plain training loop of the same
#                   module (examples/torch_models/train_loop.py: M micro-batches forward and backward, one AdamW
#                   step); a row whose framework does not import is skipped, said so
#   two+ GPUs       also gpt2-345m at micro-batch size 4 as 2D, 2P and 2M (1M1P2D, 1M2P1D, 2M1P1D) over NCCL on two
#                   of them, launched with torchrun
# A row that fails (out of memory, say) is reported and the others still run. Everything goes under OUT_DIR:
# cluster-{1,2}gpu.yaml (this machine: the nearest DGX preset with the GPU's name and memory), profiles/, traces/,
# logs/ (each row's full output), loops/ (the torch-model rows' training loops), validate.txt, validate.csv,
# validate.json.
# Environment: PYTHON (default python3), ITERATIONS (10), WARMUP (3), MICRO_BATCHES (4); ROWS (default
# "zoo torch 2gpu": every group) picks groups or single rows by name, e.g. ROWS=torch, ROWS="zoo hf-llama-1b" or
# ROWS="megatron-gpt-1.3b megatron-gpt-1.3b-recompute"; TORCH_ITERATIONS (5) and TORCH_WARMUP (2) are the torch-model
# rows' timed and untimed training steps, TORCH_REPEATS (5) their profiles' timed runs per event. The torch group
# took 4 minutes on one H100 (2026-11-26: 16-19 s a profile, 18-23 s a row), the zoo group takes about as long
# (32-45 s a row on an H200): where a call must end within 10 minutes, run ROWS=zoo and ROWS=torch as two calls.
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
#   4. transformers for the Hugging Face rows and megatron-core for the megatron rows (each group skipped with a
#      message without it). megatron-core is a single wheel (`pip install megatron-core`, 2.6 MB; it needs only
#      torch, numpy and packaging; no Transformer Engine or Apex): carry it like simpy where there is no PyPI, built
#      for the GPU machine's Python (`pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
#      megatron-core`).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
ITERATIONS=${ITERATIONS:-10}
WARMUP=${WARMUP:-3}
M=${MICRO_BATCHES:-4}
ROWS=${ROWS:-zoo torch 2gpu}
TORCH_ITERATIONS=${TORCH_ITERATIONS:-5}
TORCH_WARMUP=${TORCH_WARMUP:-2}
TORCH_REPEATS=${TORCH_REPEATS:-5}
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
mkdir -p "$OUT/profiles" "$OUT/traces" "$OUT/logs" "$OUT/loops" || exit 2
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

wanted() {  # row group: is the row asked for in ROWS (by its group or its own name)?
  [[ " $ROWS " == *" $2 "* || " $ROWS " == *" $1 "* ]]
}

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
  wanted "$model-mbs$mbs" zoo && row "$model-mbs$mbs" 1 --model "$model" --micro-batch-size "$mbs" -- 1M1P1D
done

# ------------------------------------------------------------------------------------------------- torch models
# The shipped --torch-model examples (examples/torch_models/), each as it is (row NAME) and with full recomputation
# (row NAME-recompute). The module is profiled once, without recomputation: a profile times each block's forward and
# backward, and `simulate --recompute full` adds the recomputed forward itself (a checkpointed module's profiled
# backward would hold it already, and megatron-core's checkpointing cannot be profiled block by block). Both rows
# are predicted from that profile and measured by a plain training loop of their own module, run in a process of its
# own (examples/torch_models/train_loop.py, one JSON line under loops/). Where `distsim execute` takes
# --torch-model, the row executes it too and its trace joins the suite.
TORCH_RESULTS=()
EXAMPLES="$REPO/examples/torch_models"

torch_row() {  # row spec recompute(none|full) profile
  local name=$1 spec=$2 recompute=$3 profile=$4 log="$OUT/logs/$1.log" predicted line
  echo "== $name (1M1P1D, recompute $recompute)"
  local t0=$SECONDS
  predicted=$("$PY" -m distsim simulate --model "$profile" --cluster "$OUT/cluster-1gpu.yaml" --strategy 1M1P1D \
    --micro-batches "$M" --recompute "$recompute" --json 2>>"$log" \
    | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["iteration_time_s"])') \
    || { fail "$name" simulate; return; }
  if ! "$PY" "$EXAMPLES/train_loop.py" "$spec" --micro-batches "$M" --steps "$TORCH_ITERATIONS" \
      --warmup "$TORCH_WARMUP" >"$OUT/loops/$name.json" 2>>"$log"; then
    fail "$name" "training loop"
    return
  fi
  line=$("$PY" - "$name" "$predicted" "$OUT/loops/$name.json" <<'PYEOF'
import json, sys
name, predicted, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
loop = json.loads(open(path).read().strip().splitlines()[-1])
measured = loop["median_step_s"]
print(f"{name:<30} {predicted * 1e3:9.1f} ms {measured * 1e3:9.1f} ms {100 * (predicted - measured) / measured:+7.1f} %"
      f" {100 * loop['spread']:6.1f} %")
PYEOF
  ) || { fail "$name" "loop output"; return; }
  TORCH_RESULTS+=("$line")
  echo "   $line (predicted, measured, error, spread)"
  if "$PY" -m distsim execute --help 2>/dev/null | grep -q -- "--torch-model"; then
    "$PY" -m distsim execute --torch-model "${spec%_recompute}" --recompute "$recompute" \
      --cluster "$OUT/cluster-1gpu.yaml" --strategy 1M1P1D --micro-batches "$M" --profile "$profile" \
      --iterations "$ITERATIONS" --warmup "$WARMUP" --out "$OUT/traces/$name-1M1P1D.json" >>"$log" 2>&1 \
      || fail "$name" "execute 1M1P1D"
  fi
  echo "   $((SECONDS - t0)) s"
}

torch_model() {  # name file function package: rows NAME and NAME-recompute of examples/torch_models/FILE:FUNCTION
  local name=$1 spec="$EXAMPLES/$2:$3" package=$4 profile="$OUT/profiles/$1.json" log="$OUT/logs/$1.log"
  wanted "$name" torch || wanted "$name-recompute" torch || return 0
  if ! "$PY" -c "import $package" 2>/dev/null; then
    echo "== $name, $name-recompute: skipped: $package does not import for $PY"
    return
  fi
  echo "== $name: profile (--torch-model $2:$3, $TORCH_REPEATS timed runs per event)"
  local t0=$SECONDS
  if ! "$PY" -m distsim profile --torch-model "$spec" --cluster "$OUT/cluster-1gpu.yaml" --strategy 1M1P1D \
      --micro-batches "$M" --repeats "$TORCH_REPEATS" --out "$profile" --overwrite >>"$log" 2>&1; then
    fail "$name" profile
    return
  fi
  grep -h "self-check:\|warning:" "$log" | sed 's/^/   /'
  echo "   $((SECONDS - t0)) s"
  wanted "$name" torch && torch_row "$name" "$spec" none "$profile"
  wanted "$name-recompute" torch && torch_row "$name-recompute" "${spec}_recompute" full "$profile"
}

if ! "$PY" -m distsim profile --help 2>/dev/null | grep -q -- "--torch-model"; then
  echo "== torch-model rows: skipped: this distsim's profile has no --torch-model option"
else
  torch_model hf-gpt2-medium hf_gpt2.py gpt2_medium transformers
  torch_model hf-llama-1b hf_llama.py llama_1b transformers
  torch_model megatron-gpt-medium megatron_gpt.py gpt2_medium megatron.core
  torch_model megatron-gpt-1.3b megatron_gpt.py gpt3_1_3b megatron.core
fi

# ------------------------------------------------------------------------------------------------- two GPUs, NCCL
if ! wanted gpt2-345m-mbs4-2gpu 2gpu; then
  :
elif [ "$GPUS" -ge 2 ]; then
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
if [ ${#TORCH_RESULTS[@]} -gt 0 ]; then
  {
    echo
    echo "torch-model rows (1M1P1D, M=$M): simulate --model PROFILE against examples/torch_models/train_loop.py"
    printf '  %-30s %12s %12s %9s %8s\n' row predicted measured error spread
    printf '  %s\n' "${TORCH_RESULTS[@]}"
  } | tee -a "$OUT/validate.txt"
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
