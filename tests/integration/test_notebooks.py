"""The notebooks use the public API only, are stored executed (every figure shows on the repository page), and run
top to bottom in a real Jupyter kernel showing every figure.

The fast tests check what is stored: public imports, every code cell run in order without error, an ``image/png``
stored for every cell that calls a :mod:`distsim.io.plots` function (plotting cells are found by parsing the cells, so
a new plotting cell is checked without tagging it), no path of the machine that ran them, a small file. The slow test
executes a copy of each notebook with nbclient (one ipykernel per notebook, in a temporary working directory: the
stored files are never written) and checks what a Jupyter user sees: no cell fails, every plotting cell shows an
``image/png``, and the cells show the kinds of output stored.

After a change that alters what the notebooks show, store them again (about 15 s)::

    python tests/integration/test_notebooks.py --store
"""

from __future__ import annotations

import ast
import base64
import importlib
import inspect
import json
import os
import re
import sys
import tempfile
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
MAX_BYTES = 1_500_000
"""A stored notebook's size at most: its figures are PNGs at the inline backend's modest resolution."""
MACHINE_PATH = re.compile(r"(?<![\w.])(/work|/tmp|/home|/root|/Users|/private|/var/folders)/|site-packages|[A-Z]:\\")
"""What a path of the machine that ran a notebook looks like in its text outputs."""
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


def _texts(output: nbformat.NotebookNode) -> list[str]:
    """The text a reader sees of one output (figures' image data left out: base64 may spell anything)."""
    if output.output_type == "stream":
        return [output.text]
    if output.output_type == "error":
        return [output.ename, output.evalue, *output.traceback]
    return [
        v if isinstance(v, str) else json.dumps(v) for k, v in output.get("data", {}).items() if k.startswith("text/")
    ]


def _shown(cell: nbformat.NotebookNode) -> list[tuple[str, ...]]:
    """What kinds of output a cell shows: (output type, stream name or mime types), in order."""
    return [(o.output_type, o.name) if o.output_type == "stream" else (o.output_type, *sorted(o.get("data", {})))
            for o in cell.get("outputs", [])]  # fmt: skip


def execute(nb: nbformat.NotebookNode, cwd: Path) -> None:
    """Run every cell of `nb` in order, in place, in one fresh python3 kernel started in `cwd` (anything the notebook
    writes lands there); a cell that raises stops the run with CellExecutionError, naming the cell and its traceback.
    No timestamps are recorded, so storing the result again changes only what the cells show."""
    NotebookClient(
        nb, timeout=300, kernel_name="python3", record_timing=False, resources={"metadata": {"path": str(cwd)}}
    ).execute()


def _kernel_imports_this_distsim() -> None:
    """The kernel must import the distsim under test (a checkout, or an install): put it first on the kernel's path."""
    root = str(Path(distsim.__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_public_api_and_stored_executed(name: str) -> None:
    nb = _read(name)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert code, f"{name}.ipynb has no code cells"
    store = "store them again: python tests/integration/test_notebooks.py --store"
    for k, (i, cell) in enumerate(code, start=1):
        private = _private_imports(_parse(cell.source))
        assert not private, f"{name}.ipynb cell {i} imports a private module: {private}"
        assert cell.execution_count == k, f"{name}.ipynb cell {i} is not stored run in order from the top; {store}"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{name}.ipynb cell {i} is stored failing: {errors[0].ename}; {store}"
        paths = [m.group(0) for o in cell.outputs for text in _texts(o) for m in [MACHINE_PATH.search(text)] if m]
        assert not paths, f"{name}.ipynb cell {i} shows a path of the machine that ran it: {paths[0]}"
    plotting = _plotting_cells(nb)
    assert plotting, f"{name}.ipynb calls no distsim.io.plots function"
    for i in plotting:
        assert any("image/png" in o.get("data", {}) for o in nb.cells[i].outputs), f"{name}.ipynb cell {i}: no figure"
    size = (NOTEBOOKS / f"{name}.ipynb").stat().st_size
    assert size < MAX_BYTES, f"{name}.ipynb is {size:,} bytes stored; make its figures smaller"


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
    stored = _read(name)  # read into memory: the run below changes this copy, never the stored file
    nb = _read(name)
    plotting = _plotting_cells(nb)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored after the test
    _kernel_imports_this_distsim()
    for cell in nb.cells:  # what the run shows is what it made
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell("import distsim\nprint(distsim.__file__, end='')"))  # which distsim ran
    execute(nb, tmp_path)

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
    for i, (ran, kept) in enumerate(zip(nb.cells, stored.cells, strict=False)):
        assert _shown(ran) == _shown(kept), (
            f"{name}.ipynb cell {i} now shows {_shown(ran)}, stored {_shown(kept)}: "
            "store the notebooks again (python tests/integration/test_notebooks.py --store)"
        )


def store(names: list[str]) -> None:
    """Run each notebook in a temporary directory and store it with its outputs (what the repository page shows)."""
    _kernel_imports_this_distsim()
    for name in names:
        nb = _read(name)
        with tempfile.TemporaryDirectory() as cwd:
            execute(nb, Path(cwd))
        nbformat.write(nb, NOTEBOOKS / f"{name}.ipynb")
        print(f"stored {name}.ipynb: {(NOTEBOOKS / f'{name}.ipynb').stat().st_size:,} bytes")


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:2] != ["--store"]:
        sys.exit(f"usage: python {Path(__file__).name} --store [NOTEBOOK ...]  (run and store the notebooks)")
    store(sys.argv[2:] or NAMES)
