"""The notebooks run top to bottom on the public API (their code cells are executed here, figures off screen)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["quickstart", "search"])
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)  # anything a notebook writes lands here
    data = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    cells = [c for c in data["cells"] if c["cell_type"] == "code"]
    assert cells, f"{name}.ipynb has no code cells"
    namespace: dict[str, object] = {"__name__": "__main__"}
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        for line in source.splitlines():
            assert not line.lstrip().startswith("from distsim.") or line.split()[1] in (
                "distsim.plots", "distsim.search", "distsim.io",
            ), f"{name}.ipynb cell {i} imports a private module: {line}"  # fmt: skip
        exec(compile(source, f"{name}.ipynb[{i}]", "exec"), namespace)
    plt.close("all")
