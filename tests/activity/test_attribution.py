import os

from gpuslice.activity import Attributor, ProcReader
from gpuslice.activity.attribution import FOREIGN, KERNEL, SERVER, Owner

SRV = 100
USER = 1000


def tree(fake_proc):
    """init(1) ─ server(100) ─┬ kernel A(200) ─ worker(201) ─ worker(202)
                           ├ kernel B(300)
                           └ terminal shell(400) ─ script(401)
    init(1) ─ orphaned nohup script(500, same user)
    init(1) ─ other user's process(600, uid 1001)"""
    p = fake_proc.add
    p(1, 0, uid=0)
    p(SRV, 1)
    p(200, SRV)
    p(201, 200)
    p(202, 201)
    p(300, SRV)
    p(400, SRV)
    p(401, 400)
    p(500, 1)
    p(600, 1, uid=1001)


def attributor(fake_proc, **kw):
    return Attributor(ProcReader(str(fake_proc.root)), server_pid=SRV, server_uid=USER, **kw)


KERNELS = {"A": 200, "B": 300}


def test_process_tree_attribution(fake_proc):
    tree(fake_proc)
    owners = attributor(fake_proc).resolve([200, 202, 300, 401, 500, 600, 999], KERNELS)
    assert owners[200] == Owner(KERNEL, "A", 200)
    assert owners[202] == Owner(KERNEL, "A", 202)  # grandchild (DataLoader worker)
    assert owners[300] == Owner(KERNEL, "B", 300)
    assert owners[401] == Owner(SERVER, None, 401)  # script from a terminal
    assert owners[500] == Owner(SERVER, None, 500)  # re-parented, same user
    assert owners[600] == Owner(FOREIGN, None, 600)  # someone else on a shared GPU
    assert owners[999] == Owner(FOREIGN, None, None)  # not visible at all


def test_same_user_orphans_can_be_excluded(fake_proc):
    tree(fake_proc)
    owners = attributor(fake_proc, count_same_user=False).resolve([500, 401], KERNELS)
    assert owners[500].kind == FOREIGN
    assert owners[401].kind == SERVER


def test_nearest_kernel_wins(fake_proc):
    tree(fake_proc)
    fake_proc.add(203, 202)
    owners = attributor(fake_proc).resolve([203], {"A": 200, "inner": 202})
    assert owners[203].kernel_id == "inner"


def test_container_host_pids_translated_with_nspid(fake_proc):
    # The proc root is the host's: the server runs in a container where it is PID 7,
    # kernel A is 42 and its worker 43. NVML reports host PIDs 5001/5002.
    p = fake_proc.add
    p(1, 0, uid=0)
    p(4000, 1, uid=0)  # container runtime shim
    p(5000, 4000, nspid=(5000, 7))  # the server
    p(5001, 5000, nspid=(5001, 42))
    p(5002, 5001, nspid=(5002, 43))
    p(5003, 5000, nspid=(5003, 44))  # a terminal script in the container
    att = Attributor(ProcReader(str(fake_proc.root)), server_pid=7, server_uid=USER)
    owners = att.resolve([5001, 5002, 5003], {"A": 42})
    assert owners[5001] == Owner(KERNEL, "A", 42)
    assert owners[5002] == Owner(KERNEL, "A", 43)
    assert owners[5003] == Owner(SERVER, None, 44)


def test_status_reads_are_cached_for_ttl(fake_proc, clock):
    tree(fake_proc)
    reader = ProcReader(str(fake_proc.root), ttl=30.0, clock=clock)
    att = Attributor(reader, server_pid=SRV, server_uid=USER)
    att.resolve([202], KERNELS)
    assert reader.reads == 3  # 202 → 201 → 200 (kernel)
    clock.t += 10
    att.resolve([202], KERNELS)
    assert reader.reads == 3
    clock.t += 61  # past every entry's spread-out expiry (< 2 * ttl)
    att.resolve([202], KERNELS)
    assert reader.reads == 6


def test_vanished_process_is_noticed_and_forgotten(fake_proc, clock):
    tree(fake_proc)
    reader = ProcReader(str(fake_proc.root), clock=clock)
    att = Attributor(reader, server_pid=SRV, server_uid=USER)
    att.resolve([202, 401], KERNELS)
    att.resolve([202], KERNELS)  # 401 no longer a GPU process: dropped from the cache
    fake_proc.remove(401)
    assert att.resolve([401], KERNELS)[401] == Owner(FOREIGN, None, None)


def test_ppid_loop_in_a_broken_fake_proc_terminates(fake_proc):
    fake_proc.add(10, 11)
    fake_proc.add(11, 10)
    owners = attributor(fake_proc, count_same_user=False).resolve([10], KERNELS)
    assert owners[10].kind == FOREIGN


def test_real_process_tree(spawn_kernel):
    kernel_pid, child_pid = spawn_kernel("idle")
    att = Attributor(server_pid=os.getpid())
    owners = att.resolve([child_pid, kernel_pid], {"k1": kernel_pid})
    assert owners[child_pid] == Owner(KERNEL, "k1", child_pid)
    assert owners[kernel_pid] == Owner(KERNEL, "k1", kernel_pid)
    # Without the kernel known, the same processes are the server's (they are our children).
    assert att.resolve([child_pid], {})[child_pid].kind == SERVER
