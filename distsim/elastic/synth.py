"""A seeded synthetic cluster trace in the shape of EasyScale's trace experiment (Sec. 5.2).

The paper's trace takes arrivals from Microsoft's Philly study and runtimes down-sampled from Alibaba's production
jobs; neither is published with the paper, so this generator draws:

* arrivals: a Poisson process (exponential gaps, mean ``mean_gap_s``), as Philly's job arrivals are modelled;
* gang sizes (GPUs requested, = maxP ESTs): 1, 2, 4, 8, 16 GPUs with probabilities ``SIZE_PROBS`` (most jobs
  small, a few large, as in Philly and PAI);
* runtimes at the requested gang: log-normal (median ``median_s``, sigma ``sigma``), clipped to [60 s, 8 h];
* models: uniform over the eight workloads of EasyScale's Table 1, with capabilities per GPU type in
  :data:`distsim.elastic.workloads.MODELS`;
* the GPU type each job requires of a gang scheduler (YARN-CS "allocates the same type of GPUs ... based on its
  requirement"): drawn in proportion to the cluster's GPUs, ``TYPE_SHARES`` (V100 1/2, P100 1/4, T4 1/4), from a
  second seeded stream so the other draws do not depend on it (``pin_types=False`` leaves it out). A job's runtime
  is at its gang on the fastest type, so a job pinned to a slower type runs longer under YARN-CS.

The shipped trace ``distsim/elastic/data/synthetic-150.csv`` (package data: ``distsim cluster-sim``'s default) is
``python -m distsim.elastic.synth --jobs 150 --seed 4 --out distsim/elastic/data/synthetic-150.csv``.
"""

from __future__ import annotations

import argparse
import random
import sys

from distsim.elastic.jobs import Job
from distsim.elastic.workloads import MODELS, TYPES

SIZE_PROBS = {1: 0.45, 2: 0.2, 4: 0.15, 8: 0.15, 16: 0.05}
TYPE_SHARES = dict(zip(TYPES, (0.5, 0.25, 0.25), strict=True))
"""Share of the cluster's GPUs of each type (the workloads' types, registered GPU types)."""


def generate(jobs: int, seed: int = 0, mean_gap_s: float = 20.0, median_s: float = 400.0,
             sigma: float = 1.0, pin_types: bool = True) -> list[Job]:  # fmt: skip
    """`jobs` jobs drawn as the module says, reproducibly from `seed`."""
    rng, type_rng = random.Random(seed), random.Random(seed * 7919 + 1)
    types = list(TYPE_SHARES)
    names, sizes = sorted(MODELS), list(SIZE_PROBS)
    t, out = 0.0, []
    for k in range(jobs):
        if k:
            t += rng.expovariate(1.0 / mean_gap_s)
        gpus = rng.choices(sizes, weights=[SIZE_PROBS[s] for s in sizes])[0]
        duration = min(max(rng.lognormvariate(0.0, sigma) * median_s, 60.0), 8 * 3600.0)
        model = rng.choice(names)
        pinned = type_rng.choices(types, weights=[TYPE_SHARES[x] for x in types])[0]
        out.append(Job(f"job{k:04d}", round(t, 1), gpus, gpus, round(duration, 1), model, dict(MODELS[model]),
                       pinned if pin_types else None))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    from distsim.core.errors import DistsimError
    from distsim.elastic.jobs import write_csv
    from distsim.io.output import check_output, open_output

    ap = argparse.ArgumentParser(description="Write a synthetic cluster trace (see the module docstring).")
    ap.add_argument("--jobs", type=int, default=150)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--mean-gap-s", type=float, default=20.0)
    ap.add_argument("--median-s", type=float, default=400.0)
    ap.add_argument("--any-type", action="store_true", help="do not pin a GPU type per job")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        check_output(args.out, "--out")
        jobs = generate(args.jobs, args.seed, args.mean_gap_s, args.median_s, pin_types=not args.any_type)
        with open_output(args.out) as fh:
            write_csv(jobs, fh)
    except DistsimError as exc:
        print(f"distsim: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
