"""gpuslice-sim run: a generated workload through several policies, and what it refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.sim import cli
from benchmarks.sim.cli import main
from benchmarks.sim.interactive import generate, load_parameters
from benchmarks.sim.policies import POLICIES, PROFILE_MILLI, VARIABLE
from benchmarks.sim.report import CAPACITY_WORDS, table
from gpuslice_hub.admin import capacity_check

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


SMALL = ["--days", "0.2", "--hosts", "3", "--mig-hosts", "1", "--users", "5", "--jobs", "1"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--hosts", "-3"], "argument --hosts: must be 1 or more, got -3"),
        (["--hosts", "0"], "argument --hosts: must be 1 or more, got 0"),
        (["--days", "-1"], "argument --days: must be above 0, got -1"),
        (["--days", "0"], "argument --days: must be above 0, got 0"),
        (["--days", "nan"], "argument --days: must be a finite number, got 'nan'"),
        (["--users", "0"], "argument --users: must be 1 or more, got 0"),
        (["--batch-busy", "3"], "argument --batch-busy: must be a share above 0 and at most 1"),
        (["--batch-load", "-1"], "argument --batch-load: must be 0 or more, got -1"),
        (["--mig-hosts", "-1"], "argument --mig-hosts: must be 0 or more, got -1"),
        (["--checkpoint-interval", "0"], "argument --checkpoint-interval: must be above 0"),
    ],
)
def test_an_argument_out_of_its_range_is_refused_in_one_line(args, said, capsys):
    with pytest.raises(SystemExit):
        main(["run", *args])
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


@pytest.fixture
def no_simulation(monkeypatch):
    """Any simulation started fails the test: a refusal comes before all of them."""

    def started(*a, **kw):
        raise AssertionError("a simulation started")

    monkeypatch.setattr(cli, "_simulate_all", started)
    monkeypatch.setattr(cli, "_generated", started)


@pytest.mark.parametrize(
    ("vary", "said"),
    [
        ("placement=bestfit", "--vary placement=bestfit: unknown placement policy 'bestfit'"),
        ("batch_window=garbage", "--vary batch_window=garbage: JobManager.time_windows.batch"),
        ("reserved=5", "--vary reserved=5: reserved: 5 hosts reserved, but the cluster has 3"),
        ("reserved=3", "--vary reserved=3: JobManager.reserved_pools: reserves every GPU"),
        ("reserved=1@never", "--vary reserved=1@never: JobManager.time_windows.borrow[0]"),
        ("idle_timeout=abc", "--vary idle_timeout=abc: idle_timeout must be seconds, a number"),
        (
            "idle_timeout=1800,-5",
            "--vary idle_timeout=1800,-5: idle_timeout must be seconds, a number above 0, got '-5'",
        ),
        ("slices=maybe", "--vary slices=maybe: slices must be true or false, got 'maybe'"),
        ("defrag=x", "--vary defrag=x: defrag must be jobs moved per hour"),
        ("quotas=2", "--vary quotas=2: the run is 0.2 days long: quotas on day 2 would never"),
        ("warning_lead=", "--vary warning_lead=: an empty value"),
        ("idle_timeout", "--vary idle_timeout: write it as KEY=V1,V2"),
    ],
)
def test_every_variant_is_checked_before_any_simulation(vary, said, no_simulation):
    # the base policies and a good variant first: none of them is simulated
    args = ["run", *SMALL, "--policies", "1,4", "--vary", "idle_timeout=1800", "--vary", vary]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("policy", "vary", "said"),
    [
        ("1", "idle_timeout=1800", "policy 1 reclaims nothing: idle_timeout would change nothing"),
        ("2", "warning_lead=60", "policy 2 gives no warning before a cull"),
        ("3", "defrag=2", "policy 3 submits no preemptible job to move"),
        ("2", "shares=100", "policy 2 hands out no shares: shares would change nothing"),
    ],
)
def test_a_variant_that_changes_nothing_is_refused(policy, vary, said, no_simulation):
    with pytest.raises(SystemExit, match=said):
        main(["run", *SMALL, "--policies", policy, "--vary", vary])


def test_a_variant_is_titled_by_what_it_changes():
    culler = POLICIES["2"].vary("idle_timeout", 1800.0)
    # not the base's "1 h inactivity"
    assert culler.title == "policy 2 with idle_timeout=1800.0"
    twice = POLICIES["4"].vary("defrag", 2).vary("placement", "best-fit")
    assert twice.title == "policy 4 with defrag=2, placement=best-fit"


def test_the_vary_help_names_every_key(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "(one of " + ", ".join(VARIABLE) + ")" in said


def one_job(**fields: object) -> str:
    """A one-day workload file's text with one batch job of ``fields``."""
    job = {"id": 0, "user": "a", "group": "g", "arrival": 0, "busy_milli": 800, **fields}
    return json.dumps({"days": 1, "jobs": [job]})


def test_a_bad_workload_file_is_said_with_its_name(tmp_path: Path, no_simulation):
    cases = {
        "truncated.json": ('{"days": 1, "sessions": [', "not JSON (Expecting value"),
        "list.json": ("[]", "must be a JSON object, not a list"),
        "nowork.json": (one_job(profile="gpu-1"), "jobs[0]: missing field 'work'"),
        "badday.json": ('{"days": -1}', "days must be a number above 0, got -1"),
        "badprofile.json": (
            one_job(profile="gpu-3x", work=60),
            "policy 3: the workload asks for profile 'gpu-3x', which no profile set has",
        ),
    }
    for name, (text, said) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SystemExit) as e:
            main(["run", "--workload", str(path), "--policies", "3", "--jobs", "1"])
        message = str(e.value)
        assert said in message and "\n" not in message, message
        if name != "badprofile.json":
            assert message.startswith(f"--workload {path}: ")
    with pytest.raises(SystemExit, match=r"--workload /nonexistent\.json: cannot read it"):
        main(["run", "--workload", "/nonexistent.json"])


def test_options_a_saved_workload_would_ignore_are_refused(tmp_path: Path, no_simulation):
    path = tmp_path / "w.json"
    path.write_text('{"days": 1}')
    with pytest.raises(SystemExit, match=r"^--workload: --days, --users cannot apply to a saved"):
        main(["run", "--workload", str(path), "--days", "5", "--users", "3"])


def test_cluster_trace_and_output_mistakes_are_refused_before_any_work(
    tmp_path: Path, no_simulation
):
    with pytest.raises(SystemExit, match=r"^--mig-hosts: 5 hosts in MIG mode, but --hosts is 3$"):
        main(["run", "--hosts", "3", "--mig-hosts", "5"])
    with pytest.raises(SystemExit, match=r"^--trace nosuch: no openb trace 'nosuch' \("):
        main(["run", "--trace", "nosuch"])
    with pytest.raises(SystemExit, match="no such folder"):
        main(["run", "--save-workload", str(tmp_path / "no" / "w.json")])
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="not a folder"):
        main(["run", "--out", str(tmp_path / "file")])


def test_the_report_says_what_the_capacity_check_words_mean():
    said = table([{"policy": "4", "title": "t", "capacity_check": "history fit burst"}])
    assert "- `fit`: jobs queued while less than 80 % of the pool was allocated" in said
    assert "- `history`: too little history" in said and "- `burst`: " in said


def test_the_guide_defines_every_capacity_check_word():
    guide = (Path(__file__).parents[2] / "docs" / "simulator.md").read_text()
    source = Path(capacity_check.__file__).read_text()
    codes = set(re.findall(r'"code": "([a-z-]+)"', source))
    assert codes == set(CAPACITY_WORDS)
    for code in codes:
        assert f"- `{code}`:" in guide, code
