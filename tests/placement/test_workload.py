"""Protocol section 1: the workload and its tune-up; section 2: node ranks."""

from pathlib import Path

import numpy as np

from benchmarks.tracebench.workload import build_workload, read_nodes, read_pods


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def test_rows_become_requests(tmp_path):
    pods = read_pods(
        write(
            tmp_path / "p.csv",
            POD_HEADER
            + "c,4000,100,2,1000,\n"
            + "a,1000,100,1,460,V100M16|V100M32\n"
            + "b,2000,100,0,0,\n"
            + "d,1000,100,1,1500,\n",
        )
    )
    assert [p.name for p in pods] == ["a", "b", "c", "d"]  # sorted by name
    a, b, c, d = (p.request for p in pods)
    assert (a.kind, a.gpu_milli, a.models) == ("share", 460, ("V100M16", "V100M32"))
    assert b.kind == "none" and pods[1].gpu_milli == 0
    assert (c.kind, c.count, pods[2].gpu_milli, pods[2].per_gpu_milli) == ("gpu", 2, 2000, 1000)
    # gpu_milli is clipped to 1000, which makes it a whole GPU
    assert (d.kind, d.count, pods[3].gpu_milli) == ("gpu", 1, 1000)


def test_multigpu_csv_without_spec_column(tmp_path):
    pods = read_pods(
        write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,2,8,1000\n")
    )
    assert pods[0].request.count == 8 and pods[0].request.models == ()


def test_tune_up_stops_on_per_gpu_milli(tmp_path):
    # One 2-GPU pod (R0 = 2000) and a CPU-only pod; capacity 4000, so T = 5200.
    # Copies of x add 2000 each, but the stop test adds only 1000:
    # 2000+1000 <= 5200 -> R 4000; 4000+1000 <= 5200 -> R 6000; 6000+1000 > 5200 -> stop.
    # (Testing R + 2000 instead would stop at R = 4000, with one copy.)
    pods = read_pods(write(tmp_path / "p.csv", POD_HEADER + "x,1000,1,2,1000,\ny,500,1,0,0,\n"))
    for seed in (42, 43, 44):
        w = build_workload(pods, n_nodes=3, capacity_milli=4000, seed=seed)
        assert sorted(r.cpu_milli for r in w.pods[:2]) == [500, 1000]  # originals first
        assert sum(r.kind == "gpu" for r in w.pods) == 3
        assert sum(w.demand) == 6000
        assert sorted(w.rank.tolist()) == [0, 1, 2]


def test_same_seed_same_workload(tmp_path):
    pods = read_pods(write(tmp_path / "p.csv", POD_HEADER + "x,1000,1,1,300,\ny,500,1,0,0,\n"))
    w1 = build_workload(pods, 5, 10_000, seed=7)
    w2 = build_workload(pods, 5, 10_000, seed=7)
    assert w1.pods == w2.pods and np.array_equal(w1.rank, w2.rank)


def test_nodes_sorted_by_name(tmp_path):
    nodes = read_nodes(
        write(
            tmp_path / "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn2,96000,1000,8,G2\nn1,64000,500,2,P100\n",
        )
    )
    assert [(n["name"], n["gpus"], n["model"]) for n in nodes] == [
        ("n1", 2, "P100"),
        ("n2", 8, "G2"),
    ]
