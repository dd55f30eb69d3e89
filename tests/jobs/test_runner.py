"""The runner with real kernels: cell-by-cell execution, preemption, resume, failure."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import numpy as np

from tests.harness.hub import wait_for
from tests.jobs.notebooks import loop_checkpoint_written, make_job_dir

EXIT_PREEMPTED = 75


def start_runner(job_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuslice.run", str(job_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def state(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def preempt_when(job_dir: Path, ready: Any, what: str) -> str:
    """Start the runner, send the preemption signal once ``ready()``, and return the job
    log after the runner exits as preempted."""
    proc = start_runner(job_dir)
    wait_for(ready, 60, what)
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    log = (job_dir / "job.log").read_text()
    assert proc.returncode == EXIT_PREEMPTED, log
    return log


def run_to_end(job_dir: Path, timeout: float = 120, env: dict[str, str] | None = None) -> int:
    proc = start_runner(job_dir, env)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode is not None, out
    return proc.returncode


def test_uninterrupted_run_writes_outputs_and_injects_parameters(tmp_path: Path):
    jd = make_job_dir(tmp_path / "job", parameters={"steps": 50, "lr": 0.05})
    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    st = state(jd)
    assert st["status"] == "completed" and st["cells_done"] == st["cells_total"] == 5
    result = json.loads((jd / "result.json").read_text())
    assert result["first_step"] == 0
    out = nbformat.read(jd / "output.ipynb", as_version=4)
    assert out.cells[1].metadata["tags"] == ["injected-parameters"]
    assert "steps = 50" in out.cells[1].source
    assert any("loss" in o.get("text", "") for o in out.cells[-1].outputs)
    assert (jd / "output.html").stat().st_size > 1000
    # what the cells print is in the job log too (the jobs panel shows it while it runs)
    assert re.search(r"\] \[cell 5\] loss \d", (jd / "job.log").read_text())
    # the log says which cell holds the injected parameters (its numbers count that cell)
    assert (
        "5 code cells (cell 2 sets the parameters given at submission)"
        in (jd / "job.log").read_text()
    )


def test_printed_output_reaches_the_log_while_the_cell_runs(tmp_path: Path):
    # the cell waits (at most a minute) for the test to have read the log
    cells = [
        "import os, sys, time\nprint('epoch 1 done', flush=True)\n"
        "print('a warning', file=sys.stderr, flush=True)\n"
        "deadline = time.time() + 60\n"
        "while not os.path.exists('go') and time.time() < deadline:\n    time.sleep(0.05)"
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells)
    proc = start_runner(jd)
    log = wait_for(
        lambda: "a warning" in (t := (jd / "job.log").read_text()) and t,
        60,
        "the printed lines in the log while the cell still runs",
    )
    assert "[cell 1] epoch 1 done" in log and "[cell 1 stderr] a warning" in log
    assert state(jd)["status"] == "running"
    (jd / "go").touch()
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_a_cell_without_checkpoints_is_let_finish_and_saved_once(tmp_path: Path):
    # a cell that never calls gpuslice.checkpoint: the signal cannot stop it mid-cell
    cells = [
        "import os, time\nprint('waiting', flush=True)\n"
        "deadline = time.time() + 60\n"
        "while not os.path.exists('go') and time.time() < deadline:\n    time.sleep(0.05)",
        "x = 1",
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells)
    proc = start_runner(jd)
    wait_for(lambda: "[cell 1] waiting" in (jd / "job.log").read_text(), 60, "cell 1 to run")
    os.kill(proc.pid, signal.SIGTERM)
    log = wait_for(
        lambda: "preemption signal" in (t := (jd / "job.log").read_text()) and t,
        30,
        "the runner to take the signal",
    )
    # what the log says is what happens: no "checkpointing" of a cell that cannot
    assert "the run stops at this cell's next gpuslice.checkpoint step, or at the end" in log
    (jd / "go").touch()
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED
    log = (jd / "job.log").read_text()
    # the boundary is saved once (it once was twice, the same line twice in the log)
    assert log.count("namespace snapshot after cell 1:") == 1, log
    assert "preempted before cell 2" in log


def test_preempted_mid_loop_resumes_from_saved_step_with_same_result(tmp_path: Path):
    params = {"steps": 300, "delay": 0.01}
    ref = make_job_dir(tmp_path / "ref", parameters={"steps": 300})
    assert run_to_end(ref) == 0
    expected = json.loads((ref / "result.json").read_text())

    jd = make_job_dir(tmp_path / "job", parameters=params, interval=0.3)
    # once the training loop has written at least one checkpoint of its own
    preempt_when(jd, lambda: loop_checkpoint_written(jd), "a step checkpoint")
    st = state(jd)
    assert st["status"] == "preempted" and st["preempted_attempt"] == st["attempt"] == 1
    assert st["cells_done"] == 3  # the parameters, injected-parameters and data cells
    assert st["lost_work_seconds"] < 1.0  # saved at the step after the signal

    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    result = json.loads((jd / "result.json").read_text())
    assert 0 < result["first_step"] < 300
    np.testing.assert_array_equal(result["w"], expected["w"])
    log = (jd / "job.log").read_text()
    assert "resumed from the namespace snapshot after cell" in log
    # the next run leaves the record of the one preempted (the service may read it only
    # once that run has started: issue 46)
    assert (state(jd)["attempt"], state(jd)["preempted_attempt"]) == (2, 1)


def test_failing_cell_fails_the_job_with_the_error(tmp_path: Path):
    jd = make_job_dir(tmp_path / "job", cells=["x = 1", "raise ValueError('bad data')", "y = 2"])
    assert run_to_end(jd) == 1
    st = state(jd)
    assert st["status"] == "failed"
    assert "ValueError: bad data" in st["error"] and st["cells_done"] == 1


def test_preempted_at_cell_boundary_snapshots_and_lists_unsaved(tmp_path: Path):
    cells = [
        "import threading\nlock = threading.Lock()\nfh = open('scratch.txt', 'w')\n"
        "def double(v):\n    return 2 * v\ncounter = 20",
        # a long cell without gpuslice.checkpoint: the signal waits for its end
        "import time\nfor _ in range(200):\n    time.sleep(0.01)\ncounter += 1",
        "open('result.txt', 'w').write(str(double(counter)))",
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells, interval=3600)
    log = preempt_when(jd, lambda: state(jd).get("current_cell") == 1, "the long cell")
    assert state(jd)["cells_done"] == 2
    assert "not saved: lock" in log and "not saved: fh" in log

    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    # counter was restored (21), double() re-created from its source
    assert (jd / "result.txt").read_text() == "42"


def test_signal_while_the_kernel_starts_is_a_preemption_not_a_failure(tmp_path: Path):
    jd = make_job_dir(tmp_path / "job", cells=["x = 1", "y = 2"])
    preempt_when(jd, lambda: state(jd).get("status") == "running", "the runner to start")
    assert state(jd)["status"] == "preempted"
    assert run_to_end(jd) == 0


def test_a_swallowed_preemption_is_still_a_preemption_and_saving_every_few_steps_is_exact(
    tmp_path: Path,
):
    # Two traps at once: the loop saves only every 7th step, and a bare ``except:`` catches
    # the Preempted that stops it. Counted as done, the cell would leave a partial sum.
    cells = [
        "import time\nimport gpuslice.checkpoint",
        "ckpt = gpuslice.checkpoint.open()\nstate = ckpt.restore()\n"
        "total = state['total'] if state else 0\n"
        "try:\n"
        "    for step in ckpt.steps(400):\n"
        "        total += step\n"
        "        if step % 7 == 0:\n"
        "            ckpt.save(total=total)\n"
        "        time.sleep(0.01)\n"
        "except:\n"
        "    print('carrying on')",
        "open('result.txt', 'w').write(str(total))",
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells, interval=0.3)
    log = preempt_when(jd, lambda: loop_checkpoint_written(jd), "a step checkpoint")
    assert "cell 2 caught gpuslice's Preempted" in log and "preempted in cell 2" in log
    assert state(jd)["cells_done"] == 1

    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    assert (jd / "result.txt").read_text() == str(sum(range(400)))


def test_the_notebook_runs_in_its_own_folder_and_writes_there(tmp_path: Path):
    # data next to the notebook, read by a relative path; a result written the same way
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "data.csv").write_text("1\n2\n3\n")
    cells = [
        "total = sum(int(x) for x in open('data.csv'))\nopen('total.txt', 'w').write(str(total))"
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells, workdir=folder)
    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    assert (folder / "total.txt").read_text() == "6"
    assert f"running in the notebook's folder {folder}" in (jd / "job.log").read_text()

    # a folder this host cannot reach: the job's folder, and the log says so
    gone = make_job_dir(tmp_path / "job2", cells=["x = 1"], workdir=tmp_path / "elsewhere")
    assert run_to_end(gone) == 0
    assert "is not reachable here: running in the job's folder" in (gone / "job.log").read_text()


def test_a_cell_that_clears_the_namespace_does_not_break_the_runner(tmp_path: Path):
    cells = [
        "x = 1",
        "%reset -f",
        "import gpuslice.checkpoint\nck = gpuslice.checkpoint.open()"
        "\nopen('name.txt', 'w').write(ck.name)",
    ]
    jd = make_job_dir(tmp_path / "job", cells=cells)
    assert run_to_end(jd) == 0, (jd / "job.log").read_text()
    assert (jd / "name.txt").read_text() == "cell-3"


def test_the_kernels_connection_file_is_in_the_jobs_runtime_folder(tmp_path: Path):
    """Issue 45: its ports and signing key went to the system's temporary folder (where six
    were left after cancelled jobs), not to JUPYTER_RUNTIME_DIR in the job folder, which
    the service sets for every job (jobs/accounts.py)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    seen = tmp_path / "connection-file.txt"
    cell = f"import ipykernel\nopen({str(seen)!r}, 'w').write(ipykernel.get_connection_file())"
    jd = make_job_dir(tmp_path / "job", cells=[cell])
    runtime = jd / ".runtime"
    env = {"JUPYTER_RUNTIME_DIR": str(runtime), "TMPDIR": str(temp)}
    assert run_to_end(jd, env=env) == 0, (jd / "job.log").read_text()
    used = Path(seen.read_text())
    assert used.parent == runtime and used.name.startswith("kernel-"), used
    assert oct(runtime.stat().st_mode & 0o777) == "0o700"
    assert not used.exists()  # removed with its kernel
    assert list(temp.iterdir()) == []
