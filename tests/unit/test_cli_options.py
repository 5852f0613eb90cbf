"""The CLI's typed option groups (distsim/cli/options.py): every parameter of a command lands in one of its groups,
the groups are frozen values, and the helpers that read them behave as they did on the keyword dictionaries."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest

from distsim.cli import cli
from distsim.cli.common import load_plan_for, strategy_overrides
from distsim.cli.options import (
    CommandArgs,
    CostOptions,
    ExecuteArgs,
    LaunchOptions,
    ProfileArgs,
    StrategyOptions,
    TargetOptions,
)
from distsim.cli.search_dapple import DappleArgs
from distsim.cli.search_deeppool import DeeppoolArgs
from distsim.cli.search_elastic import ElasticSearchArgs
from distsim.cli.search_grid import GridArgs
from distsim.cli.search_merge import MergeArgs
from distsim.cli.simulate import SimulateArgs
from distsim.core.errors import DistsimError
from tests.util import run_cli

ARGS: dict[tuple[str, ...], type[CommandArgs]] = {
    ("simulate",): SimulateArgs,
    ("execute",): ExecuteArgs,
    ("profile",): ProfileArgs,
    ("search", "grid"): GridArgs,
    ("search", "dapple"): DappleArgs,
    ("search", "deeppool"): DeeppoolArgs,
    ("search", "merge"): MergeArgs,
    ("search", "elastic"): ElasticSearchArgs,
}


def command(path: tuple[str, ...]) -> click.Command:
    cmd: Any = cli
    for name in path:
        with click.Context(cmd) as ctx:
            cmd = cmd.get_command(ctx, name)
    return cmd


def defaults(cmd: click.Command) -> dict[str, Any]:
    """The keyword arguments click passes when no option is given."""
    with click.Context(cmd) as ctx:
        return {p.name: p.get_default(ctx) for p in cmd.params if p.expose_value and p.name}


@pytest.mark.parametrize("path", list(ARGS), ids=[" ".join(p) for p in ARGS])
def test_every_option_lands_in_a_group(path: tuple[str, ...]) -> None:
    cmd, args_type = command(path), ARGS[path]
    params = {p.name for p in cmd.params if p.expose_value}
    assert params <= args_type.names(), f"not in a group: {params - args_type.names()}"
    kw = defaults(cmd)
    args = args_type.from_params(**kw)
    for name, value in kw.items():
        assert args.value(name) == value, name


def test_a_parameter_no_group_takes_is_refused() -> None:
    kw = defaults(command(("simulate",)))
    with pytest.raises(TypeError, match="no option group takes bogus"):
        SimulateArgs.from_params(**kw, bogus=1)


def test_groups_are_frozen() -> None:
    costs = CostOptions.from_params(profile_path="p.json", strict=True, unrelated=1)
    assert costs == CostOptions(profile_path="p.json", strict=True, allreduce="nccl")
    with pytest.raises(dataclasses.FrozenInstanceError):
        costs.strict = False  # type: ignore[misc]


def test_strategy_overrides_name_the_options_given() -> None:
    options = StrategyOptions(micro_batches=4, schedule="gpipe", partition="3:5", sequence_parallel=True)
    overrides, given = strategy_overrides(options)
    assert overrides == {"num_micro_batches": 4, "schedule": "gpipe", "partition": (3, 5), "sequence_parallel": True}
    assert given == ["--micro-batches", "--schedule", "--partition", "--sequence-parallel"]
    assert strategy_overrides(StrategyOptions()) == ({}, [])


def test_a_plan_fills_the_target_it_returns(tmp_path: Path) -> None:
    plan_file = tmp_path / "p.plan.yaml"
    plan_file.write_text("model: gpt2-cpu\ncluster: cpu-1x2\nnodes: 1\nstrategy: 1M2P1D\n")
    given = TargetOptions(plan_path=str(plan_file))
    plan, filled = load_plan_for(given)
    assert (filled.model_name, filled.cluster_name, filled.nodes) == ("gpt2-cpu", "cpu-1x2", 1)
    assert given.model_name is None and plan is not None  # the options given are left as they were
    kept = load_plan_for(dataclasses.replace(given, model_name="bert-cpu", nodes=2))[1]
    assert (kept.model_name, kept.cluster_name, kept.nodes) == ("bert-cpu", "cpu-1x2", 2)
    with pytest.raises(click.UsageError, match="not both"):
        load_plan_for(dataclasses.replace(given, strategy_text="1M1P1D"))


def test_link_bandwidth_needs_emulated_nodes() -> None:
    assert LaunchOptions().emulation() is None
    with pytest.raises(DistsimError, match="add --emulate-nodes 2"):
        LaunchOptions(link_bandwidth="1gbit").emulation()
    assert LaunchOptions(emulate_nodes=2, link_bandwidth="1gbit").emulation().world == 2


def test_profile_dry_run_takes_a_stages_plan_beside_a_uniform_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each plan is checked against its own path (a uniform plan among stages plans once broke the pairing)."""
    stages = tmp_path / "stages.yaml"
    stages.write_text("model: gpt2-cpu\ncluster: cpu-2x1\nmicro_batch_size: 2\n"
                      "stages: [{layers: [0, 3], devices: [0]}, {layers: [3, 6], devices: [1]}]\n")  # fmt: skip
    uniform = tmp_path / "uniform.yaml"
    uniform.write_text("model: gpt2-cpu\ncluster: cpu-2x1\nstrategy: 1M2P1D\n")
    code, out, err = run_cli(["profile", "--dry-run", "--plan", str(uniform), "--plan", str(stages)], capsys)
    assert code == 0, err
    assert "compute" in out + err
    bad = tmp_path / "bad.yaml"
    bad.write_text(stages.read_text().replace("[3, 6]", "[3, 5]"))
    code, _, err = run_cli(["profile", "--dry-run", "--plan", str(uniform), "--plan", str(bad)], capsys)
    assert code != 0 and f"{bad}: the stages' layers do not cover the model" in err
