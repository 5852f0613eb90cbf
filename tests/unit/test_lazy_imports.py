"""The package and its command line start without the heavy libraries: ``import distsim.cli`` and the public API's
names load no pandas, networkx, matplotlib, numpy or torch until a command or a name needs them (issue 24: a fast
start). Checked in a fresh interpreter by what it imported, never by how long it took."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pandas", "networkx", "matplotlib", "numpy", "torch", "simpy")


def imported_after(code: str) -> list[str]:
    """The heavy libraries a fresh interpreter has imported after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_command_line_imports_nothing_heavy() -> None:
    assert imported_after("import distsim.cli") == []


def test_the_package_loads_a_name_when_it_is_used() -> None:
    assert imported_after("import distsim") == []
    assert imported_after("import distsim.search") == []
    # a strategy is pure Python; a grid search needs pandas for its table
    assert "pandas" not in imported_after("from distsim import Strategy; Strategy.from_str('2M4P2D')")
    assert "pandas" in imported_after("from distsim.search import grid_search")


def test_lazy_names_are_the_public_api() -> None:
    import distsim
    import distsim.search

    for package in (distsim, distsim.search):
        assert sorted(package.__all__) == sorted(package._PUBLIC)
        for name in package.__all__:
            assert getattr(package, name) is not None
        assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = distsim.nothing  # type: ignore[attr-defined]


def test_a_model_graph_imports_networkx_only_when_asked_for() -> None:
    code = "from distsim.core.models import get_model\nm = get_model('gpt2-345m')\nm.num_layers"
    assert "networkx" not in imported_after(code)
    assert "networkx" in imported_after(code + "\nm.graph")


def test_a_simulation_summary_needs_no_table_library() -> None:
    """`distsim simulate` prints its summary from the flow's arrays: no pandas unless a table or trace is asked for."""
    run = ("from distsim.cli import main\ntry:\n    main(['simulate', '--model', 'gpt2-345m', '--cluster', "
           "'distsim-testbed', '--strategy', '2M4P2D', '--micro-batches', '8'])\nexcept SystemExit as exc:\n"
           "    assert exc.code == 0, exc.code")  # fmt: skip
    assert set(imported_after(run)) & {"pandas", "networkx", "matplotlib", "torch"} == set()


def test_rows_on_demand_index_as_a_list_does() -> None:
    from distsim.core.lazy import RowsOnDemand

    class Squares(RowsOnDemand[int]):
        def __init__(self) -> None:
            self.built: list[int] = []

        def __len__(self) -> int:
            return 5

        def _row(self, i: int) -> int:
            self.built.append(i)
            return i * i

    rows = Squares()
    assert rows[2] == 4 and rows.built == [2]  # only the row asked for is built
    assert rows[-1] == 16 and rows[1:4] == [1, 4, 9] and list(rows) == [0, 1, 4, 9, 16]
    with pytest.raises(IndexError):
        rows[5]


def test_help_lists_the_commands_without_importing_them() -> None:
    """`distsim --help` and `distsim search --help` list every command from the summaries, loading none of the
    commands' modules; each summary lists as the command's own help would (checked at two widths)."""
    import click

    from distsim.cli.app import COMMANDS, SUMMARIES, cli
    from distsim.cli.search import DRIVER_SUMMARIES, SEARCH_DRIVERS, search

    run = ("from distsim.cli import main\nimport sys\nfor argv in (['--help'], ['search', '--help']):\n    try:\n"
           "        main(argv)\n    except SystemExit as exc:\n        assert exc.code == 0, exc.code\n")  # fmt: skip
    probe = f"{run}\nimport json\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('distsim.cli'))))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert loaded & (set(COMMANDS.values()) | set(SEARCH_DRIVERS.values())) == {"distsim.cli.search"}
    for name in COMMANDS:
        assert name in done.stdout
    for group, summaries in ((cli, SUMMARIES), (search, DRIVER_SUMMARIES)):
        assert set(summaries) == set(group.lazy)
        for name, summary in summaries.items():
            cmd = group.get_command(click.Context(group), name)
            for limit in (45, 300):
                assert cmd.get_short_help_str(limit) == click.Command(name, help=summary).get_short_help_str(limit)
