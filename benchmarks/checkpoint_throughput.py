"""Checkpoint write/restore throughput against a raw sequential write on the same disk.

Usage: .venv/bin/python benchmarks/checkpoint_throughput.py [--dir DIR] [--sizes 100,1000]

For each size (MB): raw write (one buffer, write + fsync), ``gpuslice.checkpoint`` save
(one array, atomic: temp file + fsync + rename + dir fsync), the namespace snapshot (ten
arrays plus small objects), and both restores. Median of --repeat runs. Reads come from
the page cache (dropping caches would disturb other work on the machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from gpuslice.checkpoint import Checkpoint
from gpuslice.checkpoint.namespace import restore, snapshot


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def raw_write(path: str, buf: np.ndarray) -> None:
    # a new file each time, like the checkpoint's temporary file
    with open(path, "wb", buffering=0) as f:
        f.write(memoryview(buf).cast("B"))
        os.fsync(f.fileno())


def raw_read(path: str, nbytes: int) -> None:
    out = bytearray(nbytes)
    with open(path, "rb", buffering=0) as f:
        f.readinto(out)


def bench(directory: str, mb: int, repeat: int) -> dict[str, float]:
    nbytes = mb * 1_000_000
    big = np.random.default_rng(0).random(nbytes // 8)
    ns = {f"layer{i}": big[i * len(big) // 10 : (i + 1) * len(big) // 10].copy() for i in range(10)}
    ns.update(config={"lr": 0.1, "epochs": 10}, history=list(range(1000)))
    paths = {k: os.path.join(directory, f"{k}-{mb}") for k in ("raw", "ckpt", "ns")}
    results: dict[str, list[float]] = {
        k: [] for k in ("raw_w", "raw_r", "ck_w", "ck_r", "ns_w", "ns_r")
    }
    for _ in range(repeat):
        if os.path.exists(paths["raw"]):
            os.unlink(paths["raw"])
        results["raw_w"].append(timed(lambda: raw_write(paths["raw"], big)))
        results["raw_r"].append(timed(lambda: raw_read(paths["raw"], nbytes)))
        ck = Checkpoint(paths["ckpt"], interval=0)
        results["ck_w"].append(timed(lambda ck=ck: ck.save(w=big)))
        results["ck_r"].append(timed(lambda: Checkpoint(paths["ckpt"], 0).restore()))
        results["ns_w"].append(timed(lambda: snapshot(ns, paths["ns"])))
        results["ns_r"].append(timed(lambda: restore({}, paths["ns"])))
    for p in paths.values():
        os.unlink(p)
    return {k: mb / statistics.median(v) for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| size | raw write | ckpt save | ns snapshot | raw read | ckpt restore | ns restore |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for mb in (int(s) for s in args.sizes.split(",")):
        r = bench(args.dir, mb, args.repeat)
        ck_ratio, ns_ratio = r["raw_w"] / r["ck_w"], r["raw_w"] / r["ns_w"]
        print(
            f"| {mb} MB | {r['raw_w']:.0f} MB/s | {r['ck_w']:.0f} MB/s ({ck_ratio:.2f}x) "
            f"| {r['ns_w']:.0f} MB/s ({ns_ratio:.2f}x) | {r['raw_r']:.0f} MB/s "
            f"| {r['ck_r']:.0f} MB/s | {r['ns_r']:.0f} MB/s |"
        )


if __name__ == "__main__":
    main()
