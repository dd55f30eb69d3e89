"""Notebooks the job tests run: a small NumPy model trained with gpuslice.checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat

TRAIN_CELLS = [
    "steps = 300\nlr = 0.05\ndelay = 0.0",
    "import json, time\nimport numpy as np\nimport gpuslice.checkpoint\n"
    "rng = np.random.default_rng(0)\nX = rng.normal(size=(256, 8))\n"
    "y = X @ np.arange(8.0) + rng.normal(scale=0.1, size=256)",
    "ckpt = gpuslice.checkpoint.open()\nstate = ckpt.restore()\n"
    "w = state['w'] if state else np.zeros(8)\nfirst_step = ckpt.step\n"
    "for step in ckpt.steps(steps):\n"
    "    w = w - lr * X.T @ (X @ w - y) / len(X)\n"
    "    ckpt.save(w=w)\n"
    "    time.sleep(delay)",
    "loss = float(np.mean((X @ w - y) ** 2))\n"
    "json.dump({'w': w.tolist(), 'first_step': first_step, 'loss': loss},"
    " open('result.json', 'w'))\nprint('loss', loss)",
]


def notebook(cells: list[str], tag_first_as_parameters: bool = True) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Py"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    if tag_first_as_parameters:
        nb.cells[0].metadata["tags"] = ["parameters"]
    return nb


def write_notebook(path: Path, cells: list[str] = TRAIN_CELLS) -> Path:
    nbformat.write(notebook(cells), path)
    return path


def make_job_dir(
    root: Path,
    cells: list[str] = TRAIN_CELLS,
    parameters: dict[str, Any] | None = None,
    interval: float = 0.5,
    workdir: Path | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_notebook(root / "input.ipynb", cells)
    spec = {"id": 1, "name": "t", "parameters": parameters or {}, "checkpoint_interval": interval}
    if workdir is not None:
        spec["workdir"] = str(workdir)
    (root / "job.json").write_text(json.dumps(spec))
    return root


def loop_checkpoint_written(job_dir: Path) -> bool:
    """Whether a checkpoint loop has written its first checkpoint (each cell's default
    checkpoint is named after the cell: ``checkpoints/cell-<n>.ckpt``)."""
    return any((job_dir / "checkpoints").glob("cell-*.ckpt"))
