"""gpuslice.checkpoint and the namespace snapshot, in-process and in a real subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import gpuslice.checkpoint as gckpt
from gpuslice.checkpoint.format import CorruptCheckpoint
from gpuslice.checkpoint.namespace import restore, snapshot


def test_namespace_round_trip_lists_what_could_not_be_saved(tmp_path: Path):
    fh = open(tmp_path / "scratch", "w")  # noqa: SIM115 - an open file is the point
    ns = {
        "weights": np.arange(1_000_000, dtype=np.float32).reshape(1000, 1000),
        "config": {"lr": 0.1, "layers": [64, 32]},
        "lock": threading.Lock(),
        "fh": fh,
        "gen": (i for i in range(3)),
        "np": np,
        "_private": 1,
        "In": ["ipython history"],
    }
    report = snapshot(ns, str(tmp_path / "ns.ckpt"))
    fh.close()
    assert set(report["skipped"]) == {"lock", "fh", "gen"}
    assert "TypeError" in report["skipped"]["lock"]
    assert sorted(report["saved"]) == ["config", "np", "weights"]
    assert report["bytes"] > 4_000_000

    fresh: dict = {}
    result = restore(fresh, str(tmp_path / "ns.ckpt"))
    assert result["failed"] == {}
    assert set(fresh) == {"weights", "config", "np"}
    np.testing.assert_array_equal(fresh["weights"], ns["weights"])
    assert fresh["weights"].flags.writeable
    assert fresh["np"] is np and fresh["config"] == ns["config"]


def test_truncated_checkpoint_is_refused(tmp_path: Path):
    ck = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0)
    ck.save(x=np.ones(100))
    data = (tmp_path / "c.ckpt").read_bytes()
    (tmp_path / "c.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint):
        gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0).restore()


def test_steps_continue_from_the_saved_step(tmp_path: Path):
    ck = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0)  # write after every step
    total = 0
    for step in ck.steps(10):
        total += step
        ck.save(total=total)
        if step == 4:
            break  # dies inside step 4: its work is lost, steps 0-3 are safe
    again = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0)
    state = again.restore()
    assert state == {"total": 0 + 1 + 2 + 3} and again.step == 4
    assert list(again.steps(10)) == [4, 5, 6, 7, 8, 9]


DISK_FULL = """
import resource, signal, sys
import numpy as np
import gpuslice.checkpoint as g
ck = g.Checkpoint(sys.argv[1], interval=0)
ck.save(w=np.ones(1000))                   # small: fits
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
ck.save(w=np.zeros(1 << 20))               # 8 MB: the write fails like a full disk
print("saves", ck.saves)
"""


def test_a_failed_write_keeps_the_previous_good_checkpoint(tmp_path: Path):
    path = tmp_path / "c.ckpt"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DISK_FULL), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "saves 1" in out.stdout and "previous one is kept" in out.stderr
    state = gckpt.Checkpoint(str(path), interval=0).restore()
    assert state is not None
    np.testing.assert_array_equal(state["w"], np.ones(1000))
    assert [p.name for p in tmp_path.iterdir()] == ["c.ckpt"]  # no temporary file left
