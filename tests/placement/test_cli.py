"""``python -m benchmarks.tracebench openb`` end to end on a tiny trace."""

import json

import pytest

from benchmarks.tracebench.cli import main, parse_seeds


def test_parse_seeds():
    assert parse_seeds("42-44") == [42, 43, 44]
    assert parse_seeds("7,9-10") == [7, 9, 10]
    with pytest.raises(Exception, match="seed"):
        parse_seeds("x")


@pytest.fixture
def tiny(tmp_path):
    pods = tmp_path / "openb_pod_list_tiny.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "p1,1000,100,1,500,\np2,1000,100,1,1000,\np3,1000,100,0,0,\np4,1000,100,2,1000,\n"
    )
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,1000,2,T4\nn2,8000,1000,2,T4\n")
    return str(pods), str(nodes)


def test_json_output(tiny, capsys):
    pods, nodes = tiny
    main(["openb", "--pods", pods, "--nodes", nodes, "--policy", "fgd", "--seeds", "1-2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["trace"] == "tiny" and out["policy"] == "fgd" and out["seeds"] == [1, 2]
    assert set(out["allocated_pct"]) == {"100", "110", "120", "130"}
    # 4 GPUs = 4000 milli; the originals ask 3500 (87.5 %), the tune-up adds copies until 130 %
    assert all(0 <= v <= 100 for v in out["allocated_pct"].values() if v is not None)
    assert out["failed_pods"] >= 0 and out["seconds_per_seed"] > 0


def test_table_output_and_mig(tiny, capsys):
    pods, nodes = tiny
    main(["openb", "--pods", pods, "--nodes", nodes, "--policy", "default", "--seeds", "3"])
    assert "mean" in capsys.readouterr().out
    main(["openb", "--pods", pods, "--nodes", nodes, "--seeds", "3", "--mig", "mig", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["mig_pool"] == "mig" and "requested_pct_130" in out
