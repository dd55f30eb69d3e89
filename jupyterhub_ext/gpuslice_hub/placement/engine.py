"""Feasibility and a policy-driven choice among hosts.

A policy scores each feasible host (higher wins; ties go to the lowest rank) and picks
the GPUs on the chosen host. This module is the provisional engine; the fragmentation-aware
policies and the fast trace engine build on the same contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .types import Assignment, GPUState, HostState, Placement, Refusal, Request


def model_allowed(request: Request, gpu: GPUState) -> bool:
    return not request.models or gpu.model in request.models


def fitting_gpus(request: Request, host: HostState) -> list[GPUState]:
    """GPUs of ``host`` that could take (part of) ``request``."""
    out: list[GPUState] = []
    for gpu in host.gpus:
        if gpu.drained or not model_allowed(request, gpu):
            continue
        if request.kind == "mig":
            if any(s.free and s.profile == request.mig_profile for s in gpu.mig):
                out.append(gpu)
        elif gpu.is_mig:
            continue
        elif request.kind == "share":
            if gpu.free_milli >= request.gpu_milli and gpu.free_memory_mib >= request.gpu_memory_mib:
                out.append(gpu)
        elif request.kind == "gpu" and gpu.fully_free:
            out.append(gpu)
    return out


def feasible(request: Request, host: HostState) -> bool:
    if host.cpu_milli_free < request.cpu_milli or host.memory_mib_free < request.memory_mib:
        return False
    if request.kind == "none":
        return True
    n = len(fitting_gpus(request, host))
    return n >= (request.count if request.kind == "gpu" else 1)


class Policy(Protocol):
    name: str

    def score(self, request: Request, host: HostState) -> float: ...

    def pick_gpus(self, request: Request, host: HostState) -> tuple[Assignment, ...]: ...


def best_fit_gpus(request: Request, host: HostState) -> tuple[Assignment, ...]:
    """The tightest GPU for a share, the lowest-indexed free GPUs for whole GPUs."""
    gpus = fitting_gpus(request, host)
    if request.kind == "none":
        return ()
    if request.kind == "mig":
        for gpu in gpus:
            for slot in gpu.mig:
                if slot.free and slot.profile == request.mig_profile:
                    return (Assignment(gpu.uuid, slot.milli, slot.memory_mib, slot.uuid),)
        return ()
    if request.kind == "share":
        gpu = min(gpus, key=lambda g: g.free_milli)  # min() keeps the first on ties
        mem = request.gpu_memory_mib or gpu.memory_mib * request.gpu_milli // 1000
        return (Assignment(gpu.uuid, request.gpu_milli, mem),)
    return tuple(Assignment(g.uuid, 1000, g.memory_mib) for g in gpus[: request.count])


class FirstFit:
    name = "first-fit"

    def score(self, request: Request, host: HostState) -> float:
        return 0.0

    def pick_gpus(self, request: Request, host: HostState) -> tuple[Assignment, ...]:
        return best_fit_gpus(request, host)


class BestFit:
    """Prefer the host left with the least free CPU and GPU after placing."""

    name = "best-fit"

    def score(self, request: Request, host: HostState) -> float:
        free_gpu = sum(g.free_milli for g in host.gpus if not g.is_mig)
        free_gpu += sum(s.milli for g in host.gpus for s in g.mig if s.free)
        cpu_left = (host.cpu_milli_free - request.cpu_milli) / 128_000
        gpu_left = (free_gpu - request.total_gpu_milli) / 8_000
        return -(0.5 * cpu_left + 0.5 * gpu_left)

    def pick_gpus(self, request: Request, host: HostState) -> tuple[Assignment, ...]:
        return best_fit_gpus(request, host)


def place(request: Request, hosts: Sequence[HostState], policy: Policy) -> Placement | Refusal:
    """Choose a host and GPUs for ``request``; pure: ``hosts`` is not modified."""
    candidates = [h for h in hosts if feasible(request, h)]
    if not candidates:
        return Refusal(describe_shortage(request, hosts))
    best = max(candidates, key=lambda h: (policy.score(request, h), -h.rank))
    return Placement(best.name, policy.pick_gpus(request, best))


def describe_shortage(request: Request, hosts: Sequence[HostState]) -> str:
    what = {
        "none": "CPU and memory",
        "share": f"a {request.gpu_milli / 10:g}% GPU share",
        "gpu": f"{request.count} whole GPU(s) on one host",
        "mig": f"a free MIG instance {request.mig_profile}",
    }[request.kind]
    if not any(any(model_allowed(request, g) for g in h.gpus) for h in hosts) and request.models:
        return f"no host has an allowed GPU model ({', '.join(request.models)})"
    return f"no host has {what} free"
