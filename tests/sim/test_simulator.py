"""The simulator on workloads small enough to check by hand: every figure below is worked
out in the comment next to it, from the workload and the documented behaviour."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.sim import engine
from benchmarks.sim.engine import Settings, Simulation
from benchmarks.sim.measure import summary
from benchmarks.sim.policies import POLICIES
from benchmarks.sim.workload import BatchJob, Session, Stretch, Workload

DAY = 86400.0
ONE_HOST = Settings(n_hosts=1, mig_hosts=0)  # 8 whole A100s, 8 000 milli-GPU


def session(i: int, arrival: float, *stretches: Stretch, profile: str = "gpu-1") -> Session:
    return Session(i, f"user{i}", "g", arrival, profile, tuple(stretches))


def run(workload: Workload, policy: str, tmp_path: Path, settings: Settings = ONE_HOST):
    folder = tmp_path / f"p{policy}"
    folder.mkdir()
    return Simulation(workload, POLICIES[policy], settings, seed=3, folder=folder).run()


def test_one_session_gives_the_exact_allocation_and_utilization(tmp_path: Path):
    # an hour busy at half a GPU, then an hour idle, then stopped
    w = Workload(1, [session(0, 600, Stretch(3600, 500), Stretch(3600))])
    r = run(w, "1", tmp_path)
    s = summary(r)
    capacity = 8000 * DAY
    assert s["allocation_rate"] == pytest.approx(1000 * 7200 / capacity)
    assert s["effective_utilization"] == pytest.approx(500 * 3600 / capacity)
    assert s["wait_p50"] == 0 and s["requests"] == 1 and s["refused_share"] == 0
    # nothing waited or was lost: it got all the work the workload offered (issue 47)
    assert s["demand_bound"] == pytest.approx(500 * 3600 / capacity)
    assert s["share_of_bound"] == pytest.approx(1.0)


def test_a_server_of_two_gpus_counts_the_work_of_both(tmp_path: Path):
    # an hour with each of its two GPUs 40 % busy (the stretches are per GPU), then stopped
    two = Session(0, "user0", "g", 600, "gpu-2", (Stretch(3600, 400),), gpus=2)
    r = run(Workload(1, [two]), "1", tmp_path)
    s = summary(r)
    assert s["allocation_rate"] == pytest.approx(2000 * 3600 / (8000 * DAY))
    assert r.interactive_useful == pytest.approx(2 * 400 * 3600)
    busy = [x["busy"] for x in r.samples if 600 < x["t"] < 4200]
    assert busy and all(b == 800 for b in busy)


def test_a_ninth_session_waits_for_the_first_to_stop(tmp_path: Path):
    # Eight whole GPUs held from 0 to 1 000 s. The ninth asks at 100 s, is refused, and
    # tries again every 300 s (Settings.retry_after_refusal): 400, 700, then 1 000 s, when
    # the eight have stopped: it waited 900 s after three refusals.
    eight = [session(i, 0, Stretch(1000, 800)) for i in range(8)]
    w = Workload(1, [*eight, session(8, 100, Stretch(1000, 800))])
    r = run(w, "1", tmp_path)
    ninth = next(q for q in r.requests if q.session == 8)
    assert (ninth.granted, ninth.refusals) == (1000, 3)
    s = summary(r)
    assert s["refused_share"] == pytest.approx(1 / 9)
    assert s["effective_utilization"] == pytest.approx(9 * 800 * 1000 / (8000 * DAY))


def test_slices_fit_four_sessions_on_the_gpu_one_of_them_would_hold(tmp_path: Path):
    # four quarter-GPU sessions for an hour: with slices they share one GPU (250 milli
    # each), with whole GPUs each holds one: the allocated GPU-time is four times larger
    w = Workload(1, [session(i, 0, Stretch(3600, 200), profile="share-250") for i in range(4)])
    whole, sliced = summary(run(w, "1", tmp_path)), summary(run(w, "3", tmp_path))
    assert whole["allocation_rate"] == pytest.approx(4 * 1000 * 3600 / (8000 * DAY))
    assert sliced["allocation_rate"] == pytest.approx(4 * 250 * 3600 / (8000 * DAY))
    # the same work either way
    assert whole["effective_utilization"] == sliced["effective_utilization"]


def test_gpu_aware_reclaim_culls_an_idle_server_and_counts_what_it_gave_back(tmp_path: Path):
    # Busy 10 minutes, then left running idle for 5 hours. The extension's tracker counts
    # idle windows of 30 s; with a 1 h timeout the server is warned
    # at 55 min idle and culled at 60 min. (Seed 3 draws no keep-alive for this warning:
    # asserted below, since a click would move the cull an hour later.)
    w = Workload(1, [session(0, 0, Stretch(600, 500), Stretch(5 * 3600))])
    r = run(w, "3", tmp_path)
    assert (r.culls, r.warnings, r.keep_alives) == (1, 1, 0)
    s = summary(r)
    # The tracker's windows run from the spawn: the last busy one closes at 600 s, the
    # idle run starts there, and the server is culled at 600 + 3 600 s; allocated from 0.
    assert s["allocation_rate"] == pytest.approx(1000 * (600 + 3600) / (8000 * DAY))
    # the admin panel's reclaimed GPU-hours: the idle time that ended with the cull
    assert s["reclaimed_gpu_hours"] == pytest.approx(3600 / 3600)
    # nothing after the idle stretch: no second request
    assert s["requests"] == 1


def test_the_inactivity_culler_kills_gpu_work_outside_the_kernel(tmp_path: Path):
    # A visible stretch (cells run) of 10 minutes, then 3 hours of training started from a
    # terminal: busy on the GPU, silent to jupyterhub-idle-culler. Its checks come every
    # 30 minutes from the spawn; the first at least an hour after the last activity
    # (600 s) is at 5 400 s, when 4 800 s of the training had run and are lost.
    w = Workload(1, [session(0, 0, Stretch(600, 500), Stretch(3 * 3600, 900, visible=False))])
    culler, gpu_aware = run(w, "2", tmp_path), run(w, "3", tmp_path)
    assert culler.culls == 1 and culler.interactive_lost == 900 * (5400 - 600)
    assert gpu_aware.culls == 0 and gpu_aware.interactive_lost == 0
    assert gpu_aware.interactive_useful == 500 * 600 + 900 * 3 * 3600


def test_a_spawn_preempts_a_batch_job_which_loses_only_its_unsaved_work(tmp_path: Path):
    # Eight preemptible 10-hour jobs (checkpoint every 600 s) fill the host at 0. A person
    # asks for a GPU at 1 000 s: one job is asked to stop and exits 10 s later
    # (Settings.exit_delay); the spawner asks again every 2 s and gets the slice at 1 010 s.
    # The job ran 1 010 s since its last checkpoint at 600 s: 410 s are lost, and it resumes
    # from 600 s of work once the session stops (at 1 010 + 3 600 s).
    jobs = [BatchJob(i, f"b{i}", "g", 0, "gpu-1", 36000, 900, 1, 600.0) for i in range(8)]
    w = Workload(1, [session(100, 1000, Stretch(3600, 400))], jobs)
    r = run(w, "4", tmp_path)
    (request,) = r.requests
    assert request.granted == 1010 and request.refusals == 0
    assert r.losses == [410.0]
    preempted = [j for j in r.batch_jobs if j["preemptions"]]
    assert len(preempted) == 1 and preempted[0]["lost"] == pytest.approx(410)
    assert preempted[0]["last_start"] == pytest.approx(1010 + 3600)
    # By the end of the day every job has done its 10 hours (the preempted one finishes at
    # 4 610 + 36 000 - 600 s): the 410 s it lost were done twice and count once.
    useful = 8 * 900 * 36000 + 400 * 3600
    assert r.batch_lost == 900 * 410
    assert r.batch_useful + r.interactive_useful == pytest.approx(useful)


def test_a_multi_gpu_job_counts_the_work_of_every_gpu_it_keeps_busy(tmp_path: Path):
    # A four-GPU job keeping each of its GPUs 80 % busy for 2 hours does 4 x 800 milli-GPUs
    # of work for 7 200 s (not one GPU's: the openb trace gives its milli per GPU), and the
    # samples see four GPUs' worth of use while it runs.
    job = BatchJob(0, "b0", "g", 0, "gpu-4", 7200, 800, 1, 600.0, gpus=4)
    r = run(Workload(0.5, [], [job]), "4", tmp_path)
    assert r.batch_useful == pytest.approx(4 * 800 * 7200)
    running = [s["busy"] for s in r.samples if 0 < s["t"] < 7200]
    assert running and all(used == 3200 for used in running)


def test_policies_see_the_same_arrivals(tmp_path: Path):
    # the same workload through policy 1 and 4: the first request of every session is made
    # at the same time, and the same jobs are submitted at the same times
    sessions = [session(i, 1800 * i, Stretch(2400, 300), Stretch(1200)) for i in range(12)]
    jobs = [BatchJob(i, f"b{i}", "g", 900 * i, "gpu-1", 7200, 800) for i in range(10)]
    w = Workload(0.5, sessions, jobs)
    a, b = run(w, "1", tmp_path), run(w, "4", tmp_path)

    def firsts(r):
        return sorted(
            (q.session, q.asked) for q in r.requests if q.asked == w.sessions[q.session].arrival
        )

    assert firsts(a) == firsts(b) == [(s.id, s.arrival) for s in sessions]
    assert [j["arrival"] for j in a.batch_jobs] == [j["arrival"] for j in b.batch_jobs]


def test_keep_alive_beyond_the_admins_maximum_is_refused_and_the_server_culled(tmp_path):
    # Left idle for two days, warned again and again: a person who always clicks "keep
    # working" gets at most max_extension (4 h) added, then the server is culled.
    from dataclasses import replace

    always = replace(ONE_HOST, keep_alive_share=1.0)
    w = Workload(2, [session(0, 0, Stretch(600, 500), Stretch(2 * DAY))])
    r = run(w, "3", tmp_path, always)
    # each click adds one idle timeout (1 h) until 4 h are used: 4 clicks, then the cull
    # at 600 s + 1 h + 4 h
    assert r.keep_alives == 4 and r.culls == 1
    s = summary(r)
    assert s["allocation_rate"] == pytest.approx(1000 * (600 + 5 * 3600) / (8000 * 2 * DAY))


def test_the_capacity_check_reads_the_simulated_ledgers_samples(tmp_path: Path):
    # the session of the first test: a whole GPU held 600-7800 s, busy at 500 milli till
    # 4200 s. Samples every 1800 s from 0: 48 in the day, four of them (1800, 3600, 5400,
    # 7200) with the GPU allocated, two (1800, 3600) with it busy.
    w = Workload(1, [session(0, 600, Stretch(3600, 500), Stretch(3600))])
    r = run(w, "1", tmp_path)
    assert r.capacity_check is not None
    week, month = r.capacity_check["windows"]
    assert week["samples"] == month["samples"] == 48
    assert week["allocation_rate"] == pytest.approx(4 * 1000 / (48 * 8000), abs=1e-4)
    assert week["effective_utilization"] == pytest.approx(2 * 500 / (48 * 8000), abs=1e-4)
    # a day of samples is too little history for the own/rent lines, and says so
    assert summary(r)["capacity_check"] == "history no-queue"


def test_a_batch_window_holds_a_job_until_it_opens_and_requeues_it_when_it_closes(
    tmp_path: Path,
):
    # One preemptible job of 1.5 h of work (checkpoint every 600 s) arrives at 0 (Monday
    # 00:00 UTC) under a window of 01:00-02:00: it waits till 3 600 s, runs an hour, is
    # asked to stop at 7 200 s and exits 10 s later (Settings.exit_delay) having lost the
    # 10 s since its checkpoint at 3 600 s of work; it resumes the next day at 01:00 with
    # 1 800 s left, and finishes at 86 400 + 3 600 + 1 800 s.
    from benchmarks.sim.policies import POLICIES as P

    windowed = P["4"].vary("batch_window", "01:00-02:00")
    job = BatchJob(0, "b0", "g", 0, "gpu-1", 5400, 900, 1, 600.0)
    folder = tmp_path / "w"
    folder.mkdir()
    r = Simulation(Workload(2, [], [job]), windowed, ONE_HOST, seed=3, folder=folder).run()
    (j,) = r.batch_jobs
    assert j["first_start"] == 3600 and j["preemptions"] == 1
    assert r.losses == [10.0]
    assert j["last_start"] == 86400 + 3600
    assert j["state"] == "completed" and j["ended"] == pytest.approx(86400 + 3600 + 1800)
    # its queue time is every wait: 3 600 s before the first run, and from its exit (7 210 s)
    # to the next day's 01:00 (issue 47: only the first wait was counted)
    waited = 3600 + (86400 + 3600 - 7210)
    assert summary(r)["queue_p50_h"] == pytest.approx(waited / 3600)


def test_a_finer_share_menu_fits_more_jobs_that_ask_for_less_than_a_gpu(tmp_path: Path):
    # 24 jobs each needing 300 milli-GPU for 10 hours (openb's gpu_milli), busy at 240:
    # with the catalog's shares each gets a share-500 and 8 GPUs hold 16 of them, so 8
    # wait 10 hours; with shares in steps of 100 each gets a share-300 and a GPU holds 3:
    # all 24 run at once.
    jobs = [
        BatchJob(i, f"b{i}", "g", 0, "share-500", 36000, 240, 1, 600.0, request_milli=300)
        for i in range(24)
    ]
    w = Workload(0.5, [], jobs)
    catalog = run(w, "4", tmp_path)
    folder = tmp_path / "fine"
    folder.mkdir()
    fine = Simulation(w, POLICIES["4"].vary("shares", 100), ONE_HOST, seed=3, folder=folder).run()
    for r, running in ((catalog, 16), (fine, 24)):
        first_hour = [s for s in r.samples if 0 < s["t"] < 3600]
        assert first_hour and all(s["busy"] == running * 240 for s in first_hour)
    # the 12 hours run: all 24 do their 10 hours; or 16 do, and 8 start at 10 h and run 2
    assert fine.batch_useful == pytest.approx(24 * 240 * 36000)
    assert catalog.batch_useful == pytest.approx(16 * 240 * 36000 + 8 * 240 * 7200)


def test_a_share_menu_keeps_the_catalogs_shares():
    # the smallest share of the menu and the catalog (250, 500) together
    def got(step: int, milli: int) -> str:
        job = BatchJob(0, "b0", "g", 0, "share-500", 3600, 100, request_milli=milli)
        return POLICIES["4"].vary("shares", step).batch_profile(job)

    assert got(100, 220) == "share-250" and got(100, 260) == "share-300"
    assert got(500, 200) == "share-250" and got(500, 400) == "share-500"
    assert got(100, 950) == "gpu-1"
    assert (
        POLICIES["4"].batch_profile(
            BatchJob(0, "b0", "g", 0, "share-500", 3600, 100, request_milli=300)
        )
        == "share-500"
    )  # no menu: the profile it asked for


def test_a_share_menu_is_refused_unless_its_step_makes_a_menu():
    for step in (0, 10, 100, 500):
        POLICIES["4"].vary("shares", step)
    for step in (5, 501, 1000):
        with pytest.raises(ValueError, match="shares must be"):
            POLICIES["4"].vary("shares", step)


def test_a_run_removes_the_folder_it_made_and_keeps_one_it_was_given(tmp_path: Path):
    job = BatchJob(0, "b", "g", 0, "share-250", 1800, 200)
    w = Workload(1, [session(0, 600, Stretch(3600, 500))], [job])
    sim = Simulation(w, POLICIES["4"], ONE_HOST, seed=3)
    folder = sim.folder
    assert folder.is_dir()
    r = sim.run()
    assert summary(r)["jobs_submitted"] == 1 and not folder.exists()
    given = tmp_path / "kept"
    given.mkdir()
    Simulation(w, POLICIES["4"], ONE_HOST, seed=3, folder=given).run()
    assert (given / "ledger.sqlite").is_file()


def test_a_run_makes_its_folder_in_memory_only_where_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(engine, "RAM_FOLDER", str(tmp_path))
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(engine, "RAM_FOLDER_FREE", 1)
    assert engine.scratch() == str(tmp_path)
    # TMPDIR is the user's word on where temporary files go
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    assert engine.scratch() is None
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setattr(engine, "RAM_FOLDER_FREE", shutil.disk_usage(tmp_path).free + (1 << 40))
    assert engine.scratch() is None
    monkeypatch.setattr(engine, "RAM_FOLDER", str(tmp_path / "missing"))
    monkeypatch.setattr(engine, "RAM_FOLDER_FREE", 1)
    assert engine.scratch() is None


def test_an_event_due_in_the_past_runs_now_and_the_run_goes_on(tmp_path: Path):
    """Issue 47: a run on a workload it was not tuned on stopped with "time cannot go back"
    (an event worked out for a time that had passed, e.g. from when the service said the
    queue was next due); such an event is due now."""
    seen: list[float] = []

    class Late(Simulation):
        def _submit(self, job: BatchJob) -> None:
            super()._submit(job)
            self._at(self.t - 35.4, lambda: seen.append(self.t))

    job = BatchJob(0, "b0", "g", 600, "gpu-1", 1800, 900, 1, 600.0)
    folder = tmp_path / "late"
    folder.mkdir()
    r = Late(Workload(1, [], [job]), POLICIES["1"], ONE_HOST, seed=3, folder=folder).run()
    assert seen == [600.0]
    (j,) = r.batch_jobs
    assert j["state"] == "completed" and j["first_start"] == 600


def test_a_job_size_that_never_starts_is_counted_by_size(tmp_path: Path):
    """Issue 47: 14 of 15 eight-GPU jobs never started in a week, hidden by the queue's
    median. A person holds one GPU of the eight for three days: an eight-GPU job submitted
    at the start never starts, a one-GPU one does; what the workload offered bounds it."""
    person = session(0, 0, Stretch(3 * DAY, 100))
    big = BatchJob(0, "b0", "g", 0, "gpu-8", 3600, 1000, 1, 600.0, gpus=8)
    small = BatchJob(1, "b1", "g", 0, "gpu-1", 3600, 1000, 1, 600.0)
    r = run(Workload(3, [person], [big, small]), "1", tmp_path)
    s = summary(r)
    assert s["jobs_not_started_by_gpus"] == {"8": 1}
    capacity = 8000 * 3 * DAY
    offered = 100 * 3 * DAY + 8000 * 3600 + 1000 * 3600
    assert s["demand_bound"] == pytest.approx(offered / capacity)
    assert s["share_of_bound"] == pytest.approx((100 * 3 * DAY + 1000 * 3600) / offered)


def test_a_researcher_who_gave_up_counts_with_their_wait(tmp_path: Path):
    """Issue 47: the wait figures counted only the requests that got a slice, so the more
    people gave up the better they looked. Eight sessions take every GPU for three hours; a
    ninth asks a minute later and gives up after the hour it is willing to wait."""
    full = [session(i, 0, Stretch(3 * 3600, 500)) for i in range(8)]
    late = session(8, 60, Stretch(3600, 500))
    s = summary(run(Workload(1, [*full, late]), "1", tmp_path))
    assert s["gave_up"] == 1
    # (nine waits: eight of 0 s, and the hour it gave up after)
    import statistics

    hour = ONE_HOST.give_up_after
    expected = statistics.quantiles([0.0] * 8 + [hour], n=100, method="inclusive")[94]
    assert s["wait_p50"] == 0 and s["wait_p95"] == pytest.approx(expected) and expected > 0
