"""Placement: a pure function from (request, cluster state, policy) to a placement or refusal."""

from .engine import BestFit, FirstFit, Policy, feasible, fitting_gpus, place
from .types import (
    Assignment,
    GPUState,
    HostState,
    MigSlotState,
    Placement,
    Refusal,
    Request,
)

POLICIES: dict[str, type] = {"first-fit": FirstFit, "best-fit": BestFit}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; known: {sorted(POLICIES)}") from None


__all__ = [
    "POLICIES",
    "Assignment",
    "BestFit",
    "FirstFit",
    "GPUState",
    "HostState",
    "MigSlotState",
    "Placement",
    "Policy",
    "Refusal",
    "Request",
    "feasible",
    "fitting_gpus",
    "get_policy",
    "place",
]
