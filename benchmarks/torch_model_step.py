"""A user's torch module trained for real, against distsim's prediction from its `--torch-model` profile.

One process (one "GPU"): M micro-batches of the example batch, each forward, loss / M and backward, then one AdamW
step, as a plain training loop does (the Hugging Face reference in the H100 evidence is this loop). The same process
then profiles the module (`distsim profile --torch-model`, compute events only) and simulates 1M1P1D with M
micro-batches; profile and measurement alternate `--rounds` times so that a busy machine affects both alike.

Run: python benchmarks/torch_model_step.py tests.torch_helper:make --micro-batches 4 [--rounds 3 --steps 10]
(the tiny GPT-2 of the tests) or benchmarks/torch_model_step.py:make_gpt2_cpu (a Hugging Face GPT-2 of the zoo's
gpt2-cpu size); `taskset -c 1` in front gives both one core and one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

from distsim.profiler.torch_user import build

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch_models"))
from train_loop import step_times  # the one plain loop, as the GPU rows measure


def make_gpt2_cpu() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A Hugging Face GPT-2 of the zoo's gpt2-cpu dimensions (4 layers of 512, 8 heads, 128 tokens, vocabulary 8192)
    and a batch of 2 sequences."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=128, vocab_size=8192)
    ids = torch.randint(0, 8192, (2, 128), generator=torch.Generator().manual_seed(1))
    return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def measure(spec: str, micro_batches: int, steps: int) -> float:
    """Median seconds of a training step over the last `steps` of `steps + 3`: the shipped plain loop
    (examples/torch_models/train_loop.py, M micro-batches forward and backward, one AdamW step)."""
    module, batch = build(spec, torch.device("cpu"))
    return statistics.median(step_times(module, batch, micro_batches, steps, warmup=3)[3:])


def predict(spec: str, micro_batches: int, out: str) -> float:
    """distsim's iteration time for 1M1P1D with `micro_batches`, from a fresh profile of the module."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    distsim = [sys.executable, "-m", "distsim"]
    subprocess.run([*distsim, "profile", "--torch-model", spec, "--out", out, "--overwrite"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    done = subprocess.run([*distsim, "simulate", "--model", out, "--cluster", "cpu-2x1", "--nodes", "1", "--strategy",
                           "1M1P1D", "--micro-batches", str(micro_batches), "--json"], env=env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout)["iteration_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="module:function, as distsim profile --torch-model takes it")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # the profiler gives a single process all of this machine's cores (as many threads); the loop does the same
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            predicted = predict(args.spec, args.micro_batches, os.path.join(tmp, "profile.json"))
            measured = measure(args.spec, args.micro_batches, args.steps)
            error = (predicted - measured) / measured
            print(f"round {r + 1}: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
                  f"({error:+.1%}), {torch.get_num_threads()} thread(s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
