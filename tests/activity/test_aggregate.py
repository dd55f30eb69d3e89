from gpuslice.activity import Attribution, ProcessSample, aggregate
from gpuslice.activity.attribution import KERNEL, Owner

P, INST, U = Attribution.PER_PROCESS, Attribution.PER_INSTANCE, Attribution.UNAVAILABLE


def owners(*pids):
    return {p: Owner(KERNEL, "k", p) for p in pids}


def test_per_process_figures_add_up_per_device_and_cap_at_100():
    s = [ProcessSample(1, "GPU-a", 10, 70.0, P), ProcessSample(2, "GPU-a", 20, 50.0, P)]
    a = aggregate(s, owners(1, 2), complete=True)
    assert (a.util, a.memory_bytes, a.pids) == (100.0, 30, (1, 2))


def test_per_instance_figure_is_shared_not_summed():
    s = [ProcessSample(1, "MIG-a", 1, 63.0, INST), ProcessSample(2, "MIG-a", 1, 63.0, INST)]
    a = aggregate(s, owners(1, 2), complete=True)
    assert a.util == 63.0 and a.attribution is INST


def test_busiest_device_and_least_precise_attribution():
    s = [ProcessSample(1, "GPU-a", 1, 20.0, P), ProcessSample(2, "MIG-b", 1, 45.0, INST)]
    a = aggregate(s, owners(1, 2), complete=True)
    assert a.util == 45.0
    assert a.attribution is INST
    assert a.devices == ("GPU-a", "MIG-b")


def test_one_unknown_device_makes_the_total_unknown():
    s = [ProcessSample(1, "GPU-a", 1, 0.0, P), ProcessSample(2, "MIG-b", 1, None, U)]
    a = aggregate(s, owners(1, 2), complete=True)
    assert a.util is None and a.attribution is U


def test_no_process_is_zero_only_when_every_device_was_read():
    assert aggregate([], {}, complete=True).util == 0.0
    unknown = aggregate([], {}, complete=False)
    assert unknown.util is None and unknown.attribution is U
