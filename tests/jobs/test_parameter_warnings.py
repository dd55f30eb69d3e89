"""Parameters a notebook would silently overwrite are said out loud (papermill's rule for
where they go is kept: after the cell tagged ``parameters``, else first); names that cannot
be assigned are refused before the job runs."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

import nbformat
import pytest

from gpuslice.run.params import ParameterError, parameter_warnings, validate

REPO = Path(__file__).resolve().parents[2]


def nb(*sources: str, tagged: int | None = None) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_code_cell(src) for src in sources]
    if tagged is not None:
        cells[tagged].metadata["tags"] = ["parameters"]
    return nbformat.v4.new_notebook(cells=cells)


def test_the_issue_example_no_parameters_cell_and_the_value_overwritten():
    warnings = parameter_warnings(nb("n = 5", "print(n)"), {"n": 3})
    assert warnings == [
        "parameter n is set again in code cell 1 (line 1): your value 3 is overwritten",
        "no cell is tagged 'parameters': the values are set before the first cell",
    ]


def test_the_defaults_in_the_parameters_cell_are_what_injection_is_for():
    assert parameter_warnings(nb("n = 5\nlr = 0.1", "print(n, lr)", tagged=0), {"n": 3}) == []


def test_every_way_of_rebinding_a_name_later_is_found():
    later = nb(
        "n = 5",
        "for lr in range(3):\n    pass",
        "import numpy as epochs",
        "def seed():\n    pass",
        "steps += 1",
        "(batch := 4)",
        tagged=0,
    )
    params = {"lr": 1, "epochs": 2, "seed": 3, "steps": 4, "batch": 5}
    found = {w.split()[1] for w in parameter_warnings(later, params)}
    assert found == {"lr", "epochs", "seed", "steps", "batch"}


def test_local_names_magics_and_unparsable_cells_are_not_warnings():
    quiet = nb(
        "x = 1",
        "def f():\n    lr = 2\n    return lr",
        "[lr for lr in range(3)]",
        "%time y = 1\n!echo lr",
        "lr = = broken",
        "print(lr)",
        tagged=0,
    )
    assert parameter_warnings(quiet, {"lr": 0.5}) == []
    assert parameter_warnings(quiet, {}) == []


def test_a_source_stored_as_a_list_of_lines_is_read_too():
    """nbformat JSON may keep a cell's source as a list of lines (as submitted)."""
    cell = nbformat.v4.new_code_cell("")
    cell.source = ["n = 5\n", "m = 1"]
    assert any("parameter m" in w for w in parameter_warnings(nb_of(cell), {"m": 2}))


def nb_of(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=list(cells))


def test_a_keyword_is_refused_as_a_name_by_the_service_and_the_lab_alike():
    # ``import = 3`` passed both checks once, and the job failed in its injected first cell
    for name in keyword.kwlist:
        with pytest.raises(ParameterError, match="is a Python keyword"):
            validate({name: 3})
    validate({"match": 1, "type": 2, "print": 3})  # soft keywords and builtins are names
    # the lab's own list (labextension/src/params.ts) is Python's
    source = (REPO / "labextension" / "src" / "params.ts").read_text()
    listed = re.search(r"const KEYWORDS = new Set\(\s*\((.*?)\)\.split", source, re.S)
    assert listed is not None
    words = "".join(re.findall(r"'([^']*)'", listed.group(1))).split()
    assert words == keyword.kwlist
