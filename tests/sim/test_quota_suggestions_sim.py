"""Quota suggestions in the simulator, worked out by hand: on the day given, the admin
panel's suggestions over the days before are applied as its Apply button does, and people
asking beyond them are refused over quota from then on."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from benchmarks.sim.engine import Settings, Simulation
from benchmarks.sim.measure import summary
from benchmarks.sim.policies import POLICIES
from benchmarks.sim.workload import Session, Stretch, Workload
from gpuslice_hub.db.admin_models import QuotaOverrideRow

ONE_HOST = Settings(n_hosts=1, mig_hosts=0)
HOUR = 3600.0
# u0 holds two whole GPUs at once for the first hour, then asks for three at 13:00
SESSIONS = [
    Session(0, "u0", "g", 0.0, "gpu-1", (Stretch(HOUR, 500),)),
    Session(1, "u0", "g", 0.0, "gpu-1", (Stretch(HOUR, 500),)),
    *(Session(2 + i, "u0", "g", 13 * HOUR + i, "gpu-1", (Stretch(HOUR, 500),)) for i in range(3)),
]


def run(quotas: float, tmp_path: Path):
    policy = POLICIES["3"].vary("quotas", quotas) if quotas else POLICIES["3"]
    folder = tmp_path / str(quotas)
    folder.mkdir()
    sim = Simulation(Workload(1.0, SESSIONS, []), policy, ONE_HOST, seed=3, folder=folder)
    return sim, sim.run()


def test_suggestions_applied_at_noon_refuse_what_goes_beyond_the_morning_s_peak(tmp_path: Path):
    sim, on = run(0.5, tmp_path)
    # the peak of the half day before: 2 slices, 2 000 milli; x 1.2 plus 1 slice and 250
    # milli, rounded up to whole slices and to 50 milli: 4 slices, 2 650 milli, for u0 and
    # for their group g
    with sim.ledger.db.reading() as s:
        rows = s.scalars(select(QuotaOverrideRow).order_by(QuotaOverrideRow.subject)).all()
        applied = [(r.subject, r.name, r.max_slices, r.max_milli) for r in rows]
    assert applied == [("group", "g", 4.0, 2650), ("user", "u0", 4.0, 2650)]
    figures = summary(on)
    assert figures["quotas_applied"] == 2
    # the third GPU at 13:00 is 3 000 milli: over quota until one of the two is given back
    assert figures["quota_refusals"] >= 1
    assert sum(1 for q in on.requests if q.refusals) == 1
    _, off = run(0.0, tmp_path)
    assert summary(off)["quota_refusals"] == 0 and summary(off)["quotas_applied"] == 0
    assert sum(1 for q in off.requests if q.refusals) == 0


def test_a_negative_day_is_refused():
    with pytest.raises(ValueError, match="quotas must be"):
        POLICIES["4"].vary("quotas", -1.0)
