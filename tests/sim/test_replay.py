"""A site's history, written by the service's own ledger on a moved clock, replayed."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from benchmarks.sim.cli import main
from benchmarks.sim.engine import NOTEBOOK
from benchmarks.sim.interactive import load_parameters
from benchmarks.sim.replay import Profiles, export
from gpuslice_hub import clock
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.idle import reclaim_record
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.ledger import Caller
from tests.jobs.full_cluster import IdleBackend
from tests.service.conftest import build_ledger

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
HOSTS = [
    {
        "name": "h1",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [
            {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 2},
            {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["1g.10gb"] * 7},
        ],
    }
]


@pytest.fixture
def history(tmp_path: Path) -> str:
    """Three sessions over a morning: one stopped by its owner, one culled after 30 idle
    minutes, one on a MIG instance still running."""
    url = f"sqlite:///{tmp_path}/site.sqlite"
    at = clock.ManualClock(T0)
    with clock.installed(at):
        ledger = build_ledger(url, hosts=HOSTS)
        ann = Caller("ann", ("physics",), "ann")
        a, _ = ledger.allocate(ann, "share-250", "")
        at.advance(3600)
        bob = Caller("bob", ("chem",), "bob")
        b, _ = ledger.allocate(bob, "gpu-1", "")
        # ann's server reported at most 5 GiB of its 20 GiB cap
        ledger.record_usage(a["id"], 40.0, 5120.0, 0.0, 60.0)
        ledger.record_usage(a["id"], 10.0, 3000.0, 0.0, 60.0)
        at.advance(3600)
        ledger.release(a["id"], "ann", "server stopped", server_stopped=True)
        at.advance(3600)
        kind, detail = reclaim_record(b, 1800, voluntary=False)
        ledger.record_event(kind, "bob", "bob", "idle", detail)
        ledger.release(b["id"], "bob", "server stopped", server_stopped=True)
        ledger.allocate(Caller("cy", (), "cy"), "mig-1g.10gb", "")
        # a batch job submitted then, which ran 90 minutes and lost 10 of them
        jobs = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
        jobs.run_jobs_as_service_user = True
        body = {"notebook": NOTEBOOK, "profile": "gpu-1", "checkpoint_interval": 300}
        job = jobs.submit(ann, body)
        with ledger.db.writing() as s:
            row = s.get(JobRow, job["id"])
            row.run_seconds, row.lost_work_seconds = 5400.0, 600.0
        ledger.db.dispose()
    return url


def test_the_ledger_gives_the_sessions_their_times_profiles_and_culled_idle_tail(history):
    end = T0 + timedelta(hours=4)
    w = export(history, 1, load_parameters(), seed=1, batch_busy=0.8, end=end)
    start = end - timedelta(days=1)
    got = [(s.user, s.group, s.arrival, s.profile, round(s.length)) for s in w.sessions]
    base = (T0 - start).total_seconds()
    assert got == [
        ("ann", "physics", base, "share-250", 7200),
        ("bob", "chem", base + 3600, "gpu-1", 7200),
        # still running at the end of the window: its length so far
        ("cy", "(no group)", base + 3 * 3600, "mig-1g.10gb", 3600),
    ]
    # ann's peak memory as a share of her cap; nothing reported by bob's or cy's: the cap
    assert [s.peak_memory_share for s in w.sessions] == [0.25, 1.0, 1.0]
    bobs = w.sessions[1].stretches
    # culled after 30 idle minutes: the session ends with that idle time
    assert bobs[-1].seconds == 1800 and not bobs[-1].active
    (job,) = w.jobs
    assert (job.user, job.arrival, job.profile, job.work) == ("ann", base + 3 * 3600, "gpu-1", 4800)
    assert (job.slices, job.checkpoint_interval, job.busy_milli) == (1, 300, 800)
    assert w.hosts is not None and len(w.hosts[0]["gpus"]) == 3
    assert w.hosts[0]["gpus"][2]["mig"] == ["1g.10gb"] * 7


def test_replay_compares_the_policies_on_the_site_history(history, tmp_path: Path, capsys):
    out = tmp_path / "report"
    main(
        ["replay", "--from-ledger", history, "--days", "1", "--policies", "1,3", "--out", str(out)]
    )
    report = (out / "report.md").read_text()
    assert "history:" in report and "3 sessions, 1 jobs, 1 hosts" in report
    assert "| 1 |" in report and "| 3 |" in report
    assert (out / "utilization.svg").read_text().startswith("<svg")


def test_an_unreadable_ledger_is_said_plainly(tmp_path: Path):
    with pytest.raises(SystemExit, match="cannot read the history"):
        main(["replay", "--from-ledger", f"sqlite:///{tmp_path}/none/x.sqlite", "--days", "1"])


SITE_HOSTS = [
    {
        "name": "h1",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [
            {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 1},
            {
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            },
        ],
    }
]
# the site's own profiles, none of them in the simulator's catalog but gpu-1
SITE_PROFILES = [
    {"name": "big-mig", "kind": "mig", "mig_profile": "3g.40gb"},
    {"name": "mig-2g.20gb", "kind": "mig", "mig_profile": "2g.20gb"},
    {"name": "share-300", "kind": "share", "gpu_milli": 300, "gpu_memory_mib": 24576},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
]


@pytest.fixture
def site(tmp_path: Path) -> str:
    """A site with profiles of its own: ann's session on a 3g.40gb instance, dan's on a
    300-milli share; bob's job on a 2g.20gb instance, running for 30 minutes at the end
    of the window (no attempt ended: its run_seconds is still 0); ann's second job still
    queued, never run."""
    url = f"sqlite:///{tmp_path}/site.sqlite"
    at = clock.ManualClock(T0)
    with clock.installed(at):
        ledger = build_ledger(url, profiles=SITE_PROFILES, hosts=SITE_HOSTS)
        ann, bob = Caller("ann", ("physics",), "ann"), Caller("bob", ("chem",), "bob")
        a, _ = ledger.allocate(ann, "big-mig", "")
        ledger.allocate(Caller("dan", (), "dan"), "share-300", "")
        jobs = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
        jobs.run_jobs_as_service_user = True
        body = {"notebook": NOTEBOOK, "profile": "mig-2g.20gb", "checkpoint_interval": 300}
        job = jobs.submit(bob, body)
        # its run, as the scheduler starts one: a batch allocation of the job's own
        run, _ = ledger.allocate(bob, "mig-2g.20gb", f"job-{job['id']}", purpose="batch")
        with ledger.db.writing() as s:
            row = s.get(JobRow, job["id"])
            row.state, row.started_at, row.attempt_started_at = "running", T0, T0
            row.allocation_ids = [run["id"]]
        at.advance(1800)
        jobs.submit(ann, {**body, "profile": "gpu-1"})
        ledger.release(a["id"], "ann", "server stopped", server_stopped=True)
        ledger.db.dispose()
    return url


def test_a_running_job_is_replayed_with_its_work_so_far_and_its_own_size(site):
    w = export(site, 1, load_parameters(), seed=1, batch_busy=0.8, end=T0 + timedelta(hours=1))
    (job,) = w.jobs
    # its current attempt's time so far (an hour by the window's end), on the 2g.20gb
    # instance its own allocation held, not a whole GPU
    assert (job.user, job.profile, job.work, job.gpus) == ("bob", "mig-2g.20gb", 3600.0, 1)
    assert job.busy_milli == round(285 * 0.8)
    # the job still queued, never run, is left out, and the workload says so
    assert (
        "1 jobs still queued at the end of the window were left out: their length is not known"
        in (w.sources)
    )


def test_the_site_profiles_are_replayed_as_they_are_and_renames_are_said(site):
    w = export(site, 1, load_parameters(), seed=1, batch_busy=0.8)
    assert [(s.user, s.profile) for s in w.sessions] == [
        ("ann", "mig-3g.40gb"),
        ("dan", "share-300"),
    ]
    # the site's own profiles, offered to the simulation beside the catalog's
    assert {p["name"]: p for p in w.profiles} == {
        "mig-3g.40gb": {"name": "mig-3g.40gb", "kind": "mig", "mig_profile": "3g.40gb"},
        "share-300": {
            "name": "share-300",
            "kind": "share",
            "gpu_milli": 300,
            "gpu_memory_mib": 24576,
        },
        "mig-2g.20gb": {"name": "mig-2g.20gb", "kind": "mig", "mig_profile": "2g.20gb"},
    }
    modelled = next(s for s in w.sources if s.startswith("modelled:"))
    assert (
        "profiles: the site's own, by kind and size (2 kept their names; big-mig as mig-3g.40gb)"
        in (modelled)
    )


def test_a_mig_profile_the_inventory_no_longer_has_becomes_a_share_and_says_why():
    profiles = Profiles({"1g.10gb"})
    assert profiles.of("big-mig", "mig", 428, "3g.40gb", 40960) == "share-428"
    assert profiles.of("mig-1g.10gb", "mig", 142, "1g.10gb", 10240) == "mig-1g.10gb"
    assert profiles.defined["share-428"]["gpu_memory_mib"] == 40960
    assert "big-mig as share-428 (no 3g.40gb MIG instance in the present inventory: a share of" in (
        profiles.said()
    )


def test_replay_runs_the_site_profiles_and_its_report_says_what_was_left_out(
    site, tmp_path: Path, capsys
):
    out = tmp_path / "report"
    main(["replay", "--from-ledger", site, "--days", "1", "--policies", "3", "--out", str(out)])
    report = (out / "report.md").read_text()
    assert "big-mig as mig-3g.40gb" in report
    assert "1 jobs still queued at the end of the window were left out" in report
    # said on the way too, with the figures
    assert "1 jobs still queued at the end of the window were left out" in capsys.readouterr().out
    (row,) = json.loads((out / "summary.json").read_text())["policies"]
    # the sessions got the site's instances and share: none refused
    assert row["refused_share"] == 0.0 and row["requests"] == 2


def test_export_reads_the_ledger_read_only_and_says_what_it_left_out(site, tmp_path: Path, capsys):
    db = Path(site.removeprefix("sqlite:///"))
    before = db.read_bytes()
    main(["export", "--from-ledger", site, "--days", "1", "--to", str(tmp_path / "w.json")])
    assert db.read_bytes() == before
    assert sorted(p.name for p in db.parent.glob("site.sqlite*")) == ["site.sqlite"]
    said = capsys.readouterr().out
    assert "2 sessions, 1 jobs" in said and "big-mig as mig-3g.40gb" in said
    assert "1 jobs still queued at the end of the window were left out" in said


def test_a_missing_ledger_file_is_not_created_and_a_plain_path_is_explained(tmp_path: Path, capsys):
    missing = tmp_path / "nosuch.sqlite"
    for command in ("replay", "export"):
        args = [command, "--from-ledger", f"sqlite:///{missing}", "--days", "1"]
        args += ["--to", str(tmp_path / "w.json")] if command == "export" else []
        with pytest.raises(SystemExit, match=f"^cannot read the history: no such file: {missing}$"):
            main(args)
        assert not missing.exists()
    with pytest.raises(SystemExit, match="is not a database URL") as e:
        main(["replay", "--from-ledger", str(missing), "--days", "1"])
    assert f"sqlite:///{missing}" in str(e.value) and "\n" not in str(e.value)


def test_a_file_that_is_no_ledger_is_said_plainly(tmp_path: Path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).close()
    with pytest.raises(SystemExit, match="not a gpuslice database"):
        main(["replay", "--from-ledger", f"sqlite:///{other}", "--days", "1"])


def test_replay_refuses_a_cluster_size_it_would_ignore(history):
    with pytest.raises(SystemExit, match="--hosts and --mig-hosts do not apply"):
        main(["replay", "--from-ledger", history, "--hosts", "3"])


def test_a_variant_that_changes_nothing_on_a_history_is_refused(history):
    with pytest.raises(SystemExit, match="shares changes nothing on this workload"):
        main(["replay", "--from-ledger", history, "--days", "1", "--vary", "shares=100"])
