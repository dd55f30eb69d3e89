"""``place``: the service's entry point, over the same selection code as the trace benchmark.

The service passes a few ``HostState`` values; they are turned into a ``ClusterState`` (the
arrays every policy scores) and the chosen slots are turned back into ``Assignment`` values.
"""

from __future__ import annotations

from collections.abc import Sequence

from .fit import feasible_mask as _feasible_mask
from .fit import gpu_fit
from .policies.base import Policy
from .select import select
from .state import ClusterState, from_hosts, share_memory
from .types import Assignment, GPUState, HostState, Placement, Refusal, Request


def model_allowed(request: Request, gpu: GPUState) -> bool:
    return not request.models or gpu.model in request.models


def fitting_gpus(request: Request, host: HostState) -> list[GPUState]:
    """GPUs of ``host`` that could take (part of) ``request``."""
    state = from_hosts([host])
    fit = gpu_fit(state, request)
    return [gpu for i, gpu in enumerate(host.gpus) if fit[0, i]]


def feasible(request: Request, host: HostState) -> bool:
    return bool(_feasible_mask(from_hosts([host]), request)[0])


def place(
    request: Request, hosts: Sequence[HostState], policy: Policy, *, learn: bool = True
) -> Placement | Refusal:
    """Choose a host and GPUs for ``request``; pure: ``hosts`` is not modified.

    Pass ``learn=False`` for hypothetical requests (capacity probes), so that a policy that
    learns the request mix from ``place`` calls does not count them.
    """
    if not hosts:
        return Refusal("there are no hosts")
    return place_in(request, from_hosts(hosts), policy, learn=learn)


def place_in(
    request: Request,
    state: ClusterState,
    policy: Policy,
    *,
    learn: bool = True,
    host: str | None = None,
    avoid: frozenset[str] = frozenset(),
) -> Placement | Refusal:
    """``place`` on arrays the caller keeps (the service's ``ClusterCache``); not modified
    except for the policy's score cache. ``host``: on that host or nowhere; ``avoid``: not
    on these hosts."""
    chosen = select(state, request, policy, learn, host, avoid)
    if chosen is None:
        if host is not None:
            return Refusal(f"no room on {host}")
        return Refusal(describe_shortage(request, state.hosts))
    node, slots = chosen
    return Placement(state.names[node], assignments(state, node, slots, request))


def assignments(
    state: ClusterState, node: int, slots: list[int], request: Request
) -> tuple[Assignment, ...]:
    host = state.hosts[node]
    if request.kind == "mig":
        gpu = host.gpus[slots[0]]
        slot = next(s for s in gpu.mig if s.free and s.profile == request.mig_profile)
        return (Assignment(gpu.uuid, slot.milli, slot.memory_mib, slot.uuid),)
    if request.kind == "share":
        gpu = host.gpus[slots[0]]
        mem = share_memory(request, gpu.memory_mib)
        return (Assignment(gpu.uuid, request.gpu_milli, mem),)
    return tuple(Assignment(host.gpus[i].uuid, 1000, host.gpus[i].memory_mib) for i in slots)


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


__all__ = ["Policy", "describe_shortage", "feasible", "fitting_gpus", "place", "place_in"]
