"""The Kubernetes job backend keeps the Jobs and pods current with a watch (a list, then the
API's watch from the list's resourceVersion) instead of listing them every pass, against
the stand-in API server (``fake_kube_api``: real HTTP, newline-delimited watch events,
resourceVersions, 410 after compaction). No cluster runs here.

What is checked: the watch's view gives the same statuses as two lists, and a pass then
makes no list call; a Job just created is new, not gone, until the watch shows it; a watch
the server ends resumes from the last version without listing again; one whose version was
compacted away lists again; while the watch is broken, passes list (an outage reads as an
outage, never as a cache that stopped changing)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.engines import need_module

need_module("kubernetes_asyncio")

from gpuslice_hub import kubewatch  # noqa: E402
from gpuslice_hub.jobs.backends.kubernetes_client import KubernetesBackend  # noqa: E402
from tests.jobs.fake_kube_api import FakeCluster, settle, start_fake_api  # noqa: E402
from tests.jobs.test_kubernetes_backend import (  # noqa: E402
    CLASS_VALUES,
    backend,
    runner_says,
    submit,
)
from tests.jobs.test_kubernetes_manifests import validate  # noqa: E402

JOBS_PATH = "/apis/batch/v1/namespaces/gpuslice/jobs"


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake, stop = start_fake_api(FakeCluster(validate=validate, priorities=CLASS_VALUES))
    yield fake
    stop()


def watching(cluster: FakeCluster) -> KubernetesBackend:
    b = backend(cluster, watch=True)
    cluster.closers.append(b.close)
    return b


def lists(cluster: FakeCluster, since: int) -> list[dict[str, Any]]:
    """The list calls made since request ``since`` (watches are GETs with watch=true)."""
    return [r for r in cluster.requests[since:] if r["method"] == "GET" and not watch_call(r)]


def watch_call(request: dict[str, Any]) -> bool:
    return request["query"].get("watch") in ("true", "True")


def informers(b: KubernetesBackend) -> tuple[kubewatch.Informer, kubewatch.Informer]:
    assert b._informers is not None
    return b._informers


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def one_job_watched(
    cluster: FakeCluster, tmp_path: Path
) -> tuple[KubernetesBackend, dict[str, Any], kubewatch.Informer, kubewatch.Informer]:
    """A watching backend, one Job it submitted, and its two informers, current."""
    b = watching(cluster)
    ref = submit(b, tmp_path)
    b.poll_many([ref])  # (starts the watches)
    settle(b, cluster)
    return b, ref, *informers(b)


def seen(statuses: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (s.alive, s.exit_code, s.node, s.run, s.waiting, s.priority, s.state, s.completing)
        for s in statuses
    ]


def test_the_watch_gives_what_two_lists_give_and_a_pass_then_lists_nothing(
    cluster: FakeCluster, tmp_path: Path
):
    b, listing = watching(cluster), backend(cluster)
    refs = [submit(b, tmp_path, i, attempt=f"{i:08x}") for i in range(1, 8)]
    waiting, running, done, failed, preempted, gone, deleting = refs
    b.poll_many(refs)  # the first pass lists (the watch is not current yet) and starts it
    settle(b, cluster)
    b.poll_many(refs)  # the watch shows every Job created here now
    assert b._unseen == {}

    cluster.unschedulable(waiting["k8s_job"], "0/2 nodes are available")
    cluster.bind(running["k8s_job"], "gpu-node-2")
    cluster.finish(done["k8s_job"], "Complete")
    cluster.finish(failed["k8s_job"], "Failed")
    cluster.bind(preempted["k8s_job"], "gpu-node-1")
    cluster.disrupt(preempted["k8s_job"])
    runner_says(gone, "completed")
    cluster.pod_gone(gone["k8s_job"])
    cluster.bind(deleting["k8s_job"], "gpu-node-3")
    b.signal_preempt(deleting)
    settle(b, cluster)

    before = len(cluster.requests)
    watched = b.poll_many(refs)
    assert lists(cluster, before) == []  # the pass read the watch's view: nothing listed
    assert seen(watched) == seen(listing.poll_many(refs))
    assert [(s.alive, s.exit_code) for s in watched] == [
        (True, None),
        (True, None),
        (False, 0),
        (False, 1),
        (True, None),  # checkpointing on its node: its slice still in use
        (False, 0),  # gone: the runner's own record
        (True, None),  # being deleted with its grace: still the run recorded
    ]
    assert watched[1].node == "gpu-node-2" and watched[6].completing


def test_a_pass_asking_about_a_job_the_watch_does_not_show_yet_lists(
    cluster: FakeCluster, tmp_path: Path
):
    b = watching(cluster)
    old = submit(b, tmp_path, 1, attempt="00000001")
    b.poll_many([old])
    settle(b, cluster)
    cluster.held = True  # the watch lags (or stalls): what happens now reaches it later
    new = submit(b, tmp_path, 2, attempt="00000002")
    cluster.unschedulable(new["k8s_job"], "0/2 nodes are available")
    cluster.pod_gone(old["k8s_job"])
    runner_says(old, "completed")
    before = len(cluster.requests)
    status_new, status_old = b.poll_many([new, old])
    # not in the watch's view: the pass listed, and reads both as they are, never the
    # new Job as gone (which would end its job and submit it again)
    assert len(lists(cluster, before)) == 2
    assert status_new.alive and "0/2 nodes are available" in str(status_new.waiting)
    assert (status_old.alive, status_old.exit_code) == (False, 0)
    before = len(cluster.requests)
    (status_old,) = b.poll_many([old])  # about the old one only: the view will do
    assert lists(cluster, before) == [] and status_old.alive  # (the lagging view's word)

    # a Job created here and gone before the watch ever showed it: a list says so
    lost = submit(b, tmp_path, 3, attempt="00000003")
    cluster.pod_gone(lost["k8s_job"])
    (status,) = b.poll_many([lost])
    assert (status.alive, status.state) == (False, "gone")
    assert lost["k8s_job"] not in b._unseen

    cluster.held = False
    settle(b, cluster)
    before = len(cluster.requests)
    status_new, status_old = b.poll_many([new, old])
    assert lists(cluster, before) == []  # the view shows it now
    assert status_new.alive and (status_old.alive, status_old.exit_code) == (False, 0)
    assert b._unseen == {}


def test_a_watch_the_server_ends_resumes_without_listing_again(
    cluster: FakeCluster, tmp_path: Path
):
    b, ref, jobs, pods = one_job_watched(cluster, tmp_path)
    wait_for(lambda: cluster.watches == 2)  # both streams open
    cluster.cut()  # the server ends the streams (their timeoutSeconds)
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    settle(b, cluster)
    before = len(cluster.requests)
    (status,) = b.poll_many([ref])
    assert status.node == "gpu-node-1" and lists(cluster, before) == []
    assert (jobs.lists, pods.lists) == (1, 1)  # resumed from the last version seen
    watches = [r for r in cluster.requests if watch_call(r) and r["path"] == JOBS_PATH]
    first, resumed = watches[0], watches[-1]
    assert len(watches) >= 2  # watched again, from where the last stream left off
    assert int(resumed["query"]["resourceVersion"]) >= int(first["query"]["resourceVersion"])


def test_a_watch_whose_version_was_compacted_lists_again(cluster: FakeCluster, tmp_path: Path):
    b, ref, jobs, pods = one_job_watched(cluster, tmp_path)
    cluster.held = True
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    cluster.observe()
    cluster.expire()  # the versions the watch would resume from are compacted away
    cluster.cut()
    cluster.held = False
    settle(b, cluster)  # 410 Gone: listed again, and current
    assert (jobs.lists, pods.lists) == (2, 2)
    (status,) = b.poll_many([ref])
    assert status.node == "gpu-node-1"


def test_while_the_watch_is_broken_a_pass_lists_and_an_outage_reads_as_one(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(kubewatch, "RETRY_SECONDS", (0.2, 0.2))
    b, ref, jobs, pods = one_job_watched(cluster, tmp_path)
    cluster.watch_errors.extend([500] * 1000)  # every watch fails from now on
    cluster.drop()  # the connections break mid-stream
    wait_for(lambda: jobs.snapshot() is None and pods.snapshot() is None)
    # (and it stays so: each retry lists, then its watch fails again)
    monkeypatch.setattr(kubewatch, "RETRY_SECONDS", (60.0, 60.0))
    wait_for(lambda: jobs.snapshot() is None and pods.snapshot() is None)
    cluster.bind(ref["k8s_job"], "gpu-node-2")
    before = len(cluster.requests)
    (status,) = b.poll_many([ref])
    # the pass listed (the informers are waiting out their retry), and saw the bind
    assert status.node == "gpu-node-2" and len(lists(cluster, before)) == 2
    assert jobs.snapshot() is None

    # the API down: the pass fails as it does without a watch, never answering from the
    # view that stopped changing
    cluster.errors.extend([("GET", JOBS_PATH, 500)])
    with pytest.raises(Exception, match="500"):
        b.poll_many([ref])


def test_a_connection_broken_mid_stream_lists_again(cluster: FakeCluster, tmp_path: Path):
    b, ref, jobs, pods = one_job_watched(cluster, tmp_path)
    wait_for(lambda: cluster.watches == 2)  # both streams open
    cluster.drop()
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    settle(b, cluster)  # what was missed while it was down is unknown: listed again
    assert jobs.lists >= 2 and pods.lists >= 2
    (status,) = b.poll_many([ref])
    assert status.node == "gpu-node-1"


def test_a_watch_the_api_forbids_is_not_tried_again_and_the_pass_lists(
    cluster: FakeCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    b = watching(cluster)
    ref = submit(b, tmp_path)
    cluster.watch_errors.extend([403, 403])  # the service account lacks "watch"
    b.poll_many([ref])
    jobs, pods = informers(b)
    wait_for(lambda: len(cluster.watch_errors) == 0)
    wait_for(lambda: jobs.snapshot() is None and pods.snapshot() is None)
    watches = len([r for r in cluster.requests if watch_call(r)])
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    before = len(cluster.requests)
    (status,) = b.poll_many([ref])
    assert status.node == "gpu-node-1" and len(lists(cluster, before)) == 2
    assert len([r for r in cluster.requests if watch_call(r)]) == watches == 2
    assert (jobs.lists, pods.lists) == (1, 1)  # not listing again and again either
    assert "grant the service account 'watch'" in caplog.text
