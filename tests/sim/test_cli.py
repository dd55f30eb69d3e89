"""gpuslice-sim run: a generated workload through several policies, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim.cli import main
from benchmarks.sim.interactive import generate, load_parameters
from benchmarks.sim.policies import PROFILE_MILLI

# A trace in openb's format: a share, a whole GPU and a 2-GPU task, over a day.
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
TRACE = f"""{HEADER}creation_time,deletion_time,scheduled_time
p0,4000,8192,1,250,,BE,Running,0,7200,0
p1,8000,16384,1,1000,,LS,Running,3600,18000,3600
p2,8000,16384,2,1000,,BE,Running,7200,50000,7200
p3,2000,4096,1,500,,BE,Running,86400,90000,86400
"""


def test_a_run_reports_every_policy_and_variant_on_one_workload(tmp_path: Path, capsys):
    out = tmp_path / "report"
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    args = ["run", "--days", "1", "--hosts", "1", "--mig-hosts", "0", "--users", "6"]
    args += ["--batch-load", "0.5", "--trace", str(trace)]
    args += ["--policies", "1,4", "--vary", "idle_timeout=1800,7200"]
    # two policies at a time, each in a process of its own
    main([*args, "--jobs", "2", "--out", str(out), "--save-workload", str(tmp_path / "w.json")])
    summary = json.loads((out / "summary.json").read_text())
    names = [p["policy"] for p in summary["policies"]]
    assert names == ["1", "4", "4[idle_timeout=1800.0]", "4[idle_timeout=7200.0]"]
    for p in summary["policies"]:
        assert 0 <= p["effective_utilization"] <= p["allocation_rate"] <= 1
    # the saved workload replays to the same figures, one policy after another in this
    # process as in their own
    again = tmp_path / "again"
    rerun = ["run", "--workload", str(tmp_path / "w.json"), "--hosts", "1", "--mig-hosts", "0"]
    rerun += ["--jobs", "1"]
    main([*rerun, "--policies", "1,4", "--vary", "idle_timeout=1800,7200", "--out", str(again)])
    replayed = json.loads((again / "summary.json").read_text())["policies"]
    assert summary["policies"][0]["jobs_submitted"] > 0
    strip = [{k: v for k, v in p.items() if k != "wall_seconds"} for p in summary["policies"]]
    assert [{k: v for k, v in p.items() if k != "wall_seconds"} for p in replayed] == strip


def test_the_generator_is_the_same_for_the_same_seed_and_file():
    params = load_parameters()
    a = generate(params, 2, 7, PROFILE_MILLI)
    assert a == generate(params, 2, 7, PROFILE_MILLI)
    assert a != generate(params, 2, 8, PROFILE_MILLI)
    # weekday arrivals follow office hours: most sessions start between 8:00 and 18:00
    hours = [(s.arrival % 86400) // 3600 for s in a]
    assert sum(8 <= h < 18 for h in hours) > 0.6 * len(hours)


def test_a_parameter_file_with_an_unknown_key_is_refused(tmp_path: Path):
    bad = tmp_path / "p.toml"
    bad.write_text("[stretches]\nidle_median_minute = 3\n")
    with pytest.raises(SystemExit, match=r"unknown key stretches\.idle_median_minute"):
        main(["run", "--days", "0.1", "--interactive", str(bad)])


def test_an_unknown_policy_or_setting_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--days", "0.1", "--jobs", "0"])
    assert "--jobs: must be 1 or more, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="unknown policy '7'"):
        main(["run", "--days", "0.1", "--policies", "7"])
    with pytest.raises(SystemExit, match="cannot vary 'quota'"):
        main(["run", "--days", "0.1", "--policies", "4", "--vary", "quota=1"])
