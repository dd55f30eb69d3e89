"""A submitted notebook's folder (``jobs/jobdirs.py``)."""

from __future__ import annotations

import json
import stat

import nbformat
import pytest

from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.accounts import Account
from gpuslice_hub.jobs.jobdirs import create_job_dir, read_notebook


def _submitted() -> dict:
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Entraînement ☃\nsecond line"),
            nbformat.v4.new_code_cell("import math\nprint(math.pi)"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    return json.loads(nbformat.writes(nb))


def test_the_folder_holds_the_notebook_as_nbformat_writes_it(tmp_path):
    nb = read_notebook(_submitted())
    spec = {"name": "train", "parameters": {"lr": 0.1}}
    root = create_job_dir(tmp_path, 7, nb, spec, Account.current())
    written = (root / "input.ipynb").read_bytes()
    # byte for byte nbformat's own file (written once validated, not validated twice)
    expected = tmp_path / "expected.ipynb"
    nbformat.write(nb, expected)
    assert written == expected.read_bytes()
    back = nbformat.read(root / "input.ipynb", as_version=4)
    assert [c.source for c in back.cells] == [
        "# Entraînement ☃\nsecond line",
        "import math\nprint(math.pi)",
    ]
    assert json.loads((root / "job.json").read_text()) == {"id": 7, **spec}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_notebook_that_is_not_one_is_refused_with_the_reason(tmp_path):
    bad = _submitted()
    bad["cells"][1]["source"] = 42
    with pytest.raises(Refused) as e:
        read_notebook(bad)
    assert e.value.code == "bad_request" and "not a valid notebook" in e.value.message
    assert not any(tmp_path.iterdir())
