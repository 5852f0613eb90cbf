"""The notebooks use the public API only, and run top to bottom in a real Jupyter kernel showing every figure.

The slow test executes each notebook with nbclient (one ipykernel per notebook, in a temporary working directory) and
checks what a Jupyter user sees: no cell fails, and every cell that calls a :mod:`distsim.io.plots` function shows an
``image/png``. Plotting cells are found by parsing the cells, so a new plotting cell is checked without tagging it.
"""

from __future__ import annotations

import ast
import base64
import importlib
import inspect
import os
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbclient import NotebookClient

import distsim
import distsim.io.plots

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ["quickstart", "search", "deeppool"]
PUBLIC_MODULES = ("distsim", "distsim.io.plots", "distsim.search", "distsim.io.files")
PLOT_FUNCTIONS = {
    name
    for name, obj in vars(distsim.io.plots).items()
    if inspect.isfunction(obj) and obj.__module__ == "distsim.io.plots" and not name.startswith("_")
}


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def _parse(source: str) -> ast.Module:
    """A cell as Python, its IPython magics (``%matplotlib``, ``!cmd``) turned into calls as the kernel does."""
    return ast.parse(TransformerManager().transform_cell(source))


def _is_public(module: str, name: str | None) -> bool:
    """Whether `from module import name` (or `import module`, name None) stays on the public API."""
    if module not in PUBLIC_MODULES:
        return False
    if name is None:
        return True
    if module == "distsim" and name in ("plots", "search", "io"):
        return True
    public = getattr(importlib.import_module(module), "__all__", None)
    return name in public if public is not None else not name.startswith("_")


def _private_imports(tree: ast.Module) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "distsim"):
            module = "." * node.level + (node.module or "")
            bad += [f"from {module} import {a.name}" for a in node.names if not _is_public(module, a.name)]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names if a.name.startswith("distsim.")]
            bad += [f"import {m}" for m in modules if not _is_public(m, None)]
    return bad


def _plotting_cells(nb: nbformat.NotebookNode) -> list[int]:
    """Indices of the code cells that call a distsim.io.plots function, following the names earlier cells imported."""
    functions: set[str] = set()  # names bound to a plot function
    modules = {"distsim.io.plots"}  # expressions naming the distsim.io.plots module
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tree = _parse(cell.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "distsim.io.plots":
                functions |= {a.asname or a.name for a in node.names if a.name in PLOT_FUNCTIONS}
            elif isinstance(node, ast.ImportFrom) and node.module == "distsim":
                modules |= {a.asname or a.name for a in node.names if a.name == "plots"}
            elif isinstance(node, ast.Import):
                modules |= {a.asname for a in node.names if a.name == "distsim.io.plots" and a.asname}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (isinstance(f, ast.Name) and f.id in functions) or (
                isinstance(f, ast.Attribute) and f.attr in PLOT_FUNCTIONS and ast.unparse(f.value) in modules
            ):
                found.append(i)
                break
    return found


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_public_api_and_stored_small(name: str) -> None:
    nb = _read(name)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert code, f"{name}.ipynb has no code cells"
    for i, cell in code:
        private = _private_imports(_parse(cell.source))
        assert not private, f"{name}.ipynb cell {i} imports a private module: {private}"
        # outputs are made by running the notebook (the slow test); stored ones would go stale and grow the repository
        assert not cell.outputs and cell.execution_count is None, f"{name}.ipynb cell {i} is stored with its outputs"
    assert _plotting_cells(nb), f"{name}.ipynb calls no distsim.io.plots function"


def test_plot_figures_display_as_png_without_pyplot() -> None:
    """What ``display(fig)`` and a cell ending in ``fig`` ask of IPython, outside a kernel: each figure distsim.io.plots
    makes has an image/png representation, also where matplotlib-inline has registered no figure formatter."""
    from IPython.core.formatters import DisplayFormatter

    from distsim import Strategy, get_cluster, get_model, simulate
    from distsim.search import GridSpec, grid_search

    model, cluster = get_model("gpt2-345m:layers=4"), get_cluster("distsim-testbed")
    timeline = simulate(model, cluster, Strategy.from_str("1M2P8D", num_micro_batches=4)).timeline
    table = grid_search(model, cluster, GridSpec(gpus=16, global_batch=16)).table()
    figures = [
        distsim.io.plots.gantt(timeline).figure,
        distsim.io.plots.search_bars(table).figure,
        distsim.io.plots.compare_gantt(timeline, timeline),
    ]
    for fig in figures:
        data, _ = DisplayFormatter().format(fig)
        assert "image/png" in data, f"{data['text/plain']} shows as text only"
        assert data["image/png"].startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_a_kernel_and_shows_its_figures(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = _read(name)
    plotting = _plotting_cells(nb)
    # the kernel must import the distsim under test (a checkout, or an install): put it first on the kernel's path,
    # and have a last cell report which one it imported
    root = str(Path(distsim.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    nb.cells.append(nbformat.v4.new_code_cell("import distsim\nprint(distsim.__file__, end='')"))
    # one kernel for the whole notebook, started in tmp_path so that anything the notebook writes lands there;
    # a cell that raises stops the run with CellExecutionError, naming the cell and its traceback
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    kernel_distsim = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert Path(kernel_distsim).resolve() == Path(distsim.__file__).resolve(), f"the kernel imported {kernel_distsim}"
    for i, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{name}.ipynb cell {i} failed: {errors[0].ename}: {errors[0].evalue}"
    for i in plotting:
        images = [o.data["image/png"] for o in nb.cells[i].outputs if "image/png" in o.get("data", {})]
        shown = [o.get("data", {}).get("text/plain", o.output_type) for o in nb.cells[i].outputs]
        assert images, f"{name}.ipynb cell {i} calls distsim.io.plots but shows no image, only {shown}"
        assert all(base64.b64decode(png).startswith(b"\x89PNG\r\n\x1a\n") for png in images)
