"""``distsim search``: the group of search drivers, and the options and helpers they share.

Each driver's command lives in its own module (``search_grid``, ``search_dapple``, ``search_deeppool``,
``search_merge``, ``search_elastic``) and registers on :data:`search` when its command is asked for
(:data:`SEARCH_DRIVERS`); this module imports none of them (they import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from distsim.cli.app import LazyGroup, cli
from distsim.cli.common import framework_option, load_model_and_cluster, parse_int_list
from distsim.cli.options import CostOptions, ModelOptions


def opt_int_list(text: str | None, option: str) -> tuple[int, ...] | None:
    return None if text is None else parse_int_list(text, option)


def check_directory(path: str | None, option: str) -> None:
    """Fail before a long search, not after it, when an output directory cannot be created or written."""
    from distsim.io.output import check_directory as check

    if path:
        check(path, option)


@dataclass(frozen=True)
class SearchOptions(ModelOptions):
    """What the drivers plan for: --model, --cluster, --nodes, --gpus and --global-batch (of :func:`shared_options`,
    whose --profile and --strict are :class:`~distsim.cli.options.CostOptions`, --json an
    :class:`~distsim.cli.options.OutputOptions`)."""

    gpus: int | None = None
    global_batch: int = 1


def model_and_gpus(search: SearchOptions, costs: CostOptions | None = None) -> tuple[Any, Any, int]:
    """--model, --cluster (with --nodes; the model with --framework's kernels) and the GPU count to plan for (--gpus,
    default all)."""
    model, cluster = load_model_and_cluster(search, costs)
    return model, cluster, search.gpus or cluster.num_gpus


def shared_options(f: Any) -> Any:
    options = [
        click.option("--model", "-m", "model_name", required=True, metavar="NAME|FILE",
                     help="Zoo model (see `distsim models`), a YAML/JSON model file, or hf:PATH (a Hugging Face "
                     "config.json)."),
        click.option("--cluster", "-c", "cluster_name", required=True, metavar="NAME|FILE",
                     help="Cluster preset (see `distsim clusters`) or a YAML/JSON cluster file."),
        click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count."),
        click.option("--gpus", type=click.IntRange(min=1),
                     help="GPUs to plan for (whole nodes, at most the cluster's). [default: all]"),
        click.option("--global-batch", type=click.IntRange(min=1), required=True,
                     help="Samples per iteration; every candidate trains exactly this many."),
        click.option("--profile", "profile_path", type=click.Path(dir_okay=False), metavar="FILE",
                     help="Profile database with measured event times. [default: analytic estimates]"),
        click.option("--strict", is_flag=True, help="With --profile: fail on an event the profile lacks."),
        framework_option,
        click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the table."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


SEARCH_DRIVERS = {
    "grid": "distsim.cli.search_grid", "dapple": "distsim.cli.search_dapple", "deeppool": "distsim.cli.search_deeppool",
    "merge": "distsim.cli.search_merge", "elastic": "distsim.cli.search_elastic",
}  # fmt: skip
"""Each driver's module, imported when its command is asked for (:class:`~distsim.cli.app.LazyGroup`)."""
DRIVER_SUMMARIES = {
    "dapple": "DAPPLE's planner: uneven stages, stage replication and device placement (Fan et al. 2021, Sec. IV).",
    "deeppool": "DeepPool's planner: each layer data-parallel over its own number of GPUs (burst parallelism).",
    "elastic": "EasyScale's intra-job planner: how many GPUs of each type host the job's maxP ESTs, and how many "
    "ESTs each.",
    "grid": "Grid search over tensor x pipeline x data degrees, micro-batch sizes and schedules (DistSim Sec. 6).",
    "merge": "MG-WFBP: merge layers' gradients into fewer all-reduces, and compare every way of synchronising them.",
}
"""Each driver's summary in ``distsim search --help``."""


@cli.group(cls=LazyGroup, lazy=SEARCH_DRIVERS, summaries=DRIVER_SUMMARIES)
def search() -> None:
    """Search strategies with the simulator: DistSim's grid search, DAPPLE's or DeepPool's planner, MG-WFBP's
    gradient merging, or EasyScale's placement of elastic workers on heterogeneous GPUs.

    \b
    Examples:
      distsim search grid --model bert-exlarge --cluster distsim-a10 --global-batch 16
      distsim search dapple --model bert-exlarge --cluster dapple-a --global-batch 64
      distsim search merge --model resnet50 --cluster v100-10gbe --micro-batch-size 32
      distsim search deeppool --model vgg16 --cluster dgx-a100 --nodes 1 --global-batch 32
      distsim search elastic --model resnet50 --max-workers 16 --gpus V100:4,T4:8
    The first four write their plan as a file that `distsim simulate --plan FILE` simulates.
    """
