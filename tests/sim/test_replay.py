"""A site's history, written by the service's own ledger on a moved clock, replayed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from benchmarks.sim.cli import main
from benchmarks.sim.engine import NOTEBOOK
from benchmarks.sim.interactive import load_parameters
from benchmarks.sim.replay import export
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
