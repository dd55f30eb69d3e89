"""Placement: a pure function from (request, cluster state, policy) to a placement or refusal."""

from .engine import Policy, feasible, fitting_gpus, place, place_in
from .policies.default import Default
from .policies.fgd import FGD
from .policies.packing import GpuClustering, GpuPacking
from .policies.simple import BestFit, DotProd, FirstFit, Random
from .types import (
    Assignment,
    GPUState,
    HostState,
    MigSlotState,
    Placement,
    Refusal,
    Request,
)

POLICIES: dict[str, type] = {
    "default": Default,
    "first-fit": FirstFit,
    "best-fit": BestFit,
    "random": Random,
    "dotprod": DotProd,
    "gpu-packing": GpuPacking,
    "gpu-clustering": GpuClustering,
    "fgd": FGD,
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; known: {sorted(POLICIES)}") from None


__all__ = [
    "FGD",
    "POLICIES",
    "Assignment",
    "BestFit",
    "Default",
    "DotProd",
    "FirstFit",
    "GPUState",
    "GpuClustering",
    "GpuPacking",
    "HostState",
    "MigSlotState",
    "Placement",
    "Policy",
    "Random",
    "Refusal",
    "Request",
    "feasible",
    "fitting_gpus",
    "get_policy",
    "place",
    "place_in",
]
