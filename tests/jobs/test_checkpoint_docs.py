"""The examples of docs/checkpointing.md, run as jobs by the real runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

from tests.jobs.notebooks import loop_checkpoint_written, make_job_dir
from tests.jobs.test_runner import preempt_when, run_to_end, state

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpointing.md"

# Slows each step down so the preemption lands in the middle of the loop; the example's
# own code runs unchanged. The patch lives on the class, so a resumed kernel runs fast.
SLOW_STEPS = (
    "import time\nimport gpuslice.checkpoint as _g\n_save = _g.Checkpoint.save\n"
    "def _slow(self, **state):\n    _save(self, **state)\n    time.sleep(0.005)\n"
    "_g.Checkpoint.save = _slow"
)
DUMP_W = "import json\njson.dump(w.tolist(), open('w.json', 'w'))"


def example(name: str) -> list[str]:
    text = DOC.read_text()
    m = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", text, re.S)
    assert m, f"no example {name!r} in {DOC}"
    return [c.strip() for c in m.group(1).split("# %%")]


def test_the_numpy_loop_example_resumes_to_the_uninterrupted_result(tmp_path: Path):
    cells = example("numpy-loop")
    assert len(cells) == 3 and "ckpt.steps(" in cells[1]
    ref = make_job_dir(tmp_path / "ref", cells=[*cells, DUMP_W])
    assert run_to_end(ref) == 0, (ref / "job.log").read_text()
    expected = json.loads((ref / "w.json").read_text())

    jd = make_job_dir(tmp_path / "job", cells=[SLOW_STEPS, *cells, DUMP_W], interval=0.3)
    log = preempt_when(jd, lambda: loop_checkpoint_written(jd), "the loop's first checkpoint")
    assert state(jd)["cells_done"] == 2 and "preempted in cell 3" in log

    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    out = nbformat.read(jd / "output.ipynb", as_version=4)
    resumed = "".join(o.get("text", "") for o in out.cells[2].outputs)
    found = re.search(r"'cell-3' resumed after step (\d+): continuing at step (\d+)", resumed)
    assert found and int(found.group(2)) == int(found.group(1)) + 1, resumed
    assert json.loads((jd / "w.json").read_text()) == expected
