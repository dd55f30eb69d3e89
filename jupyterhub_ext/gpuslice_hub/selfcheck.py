"""At start, the service asks the hub what its own token may do, and says what is missing.

``configure_jupyterhub`` gives the service a role with the scopes it needs (listing users
and servers to reconcile, stopping servers whose slice is reclaimed). A hub config that
replaced that role afterwards (``c.JupyterHub.load_roles`` set through a plain dict, a
whole ``c.JupyterHub`` section assigned) leaves a service that starts, and whose reconciler
and reclaims then fail one by one (issue 45). Said once at start, naming what is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gpuslice.jsonclient import JSONError

from .hubapi import HubAPI


def missing_scopes(granted: Iterable[str], needed: Iterable[str]) -> list[str]:
    """The ``needed`` scopes not in ``granted`` (the hub's expanded list, as ``GET
    /hub/api/user`` answers for a token), in the order they are needed."""
    have = set(granted)
    return [scope for scope in needed if scope not in have]


async def check_own_scopes(
    hub_api: HubAPI, needed: Iterable[str], log: logging.Logger | Any
) -> list[str]:
    """Ask the hub for this token's scopes and warn of the missing ones; returns them
    (an empty list also when the hub could not be asked: that is warned of elsewhere)."""
    try:
        me = await hub_api.whoami()
    except JSONError as e:
        log.warning("gpuslice: could not ask the hub what this service may do: %s", e)
        return []
    missing = missing_scopes(me.get("scopes") or [], needed)
    if missing:
        log.warning(
            "gpuslice: the hub gives this service's token no %s: configure_jupyterhub's "
            "role for it was dropped or changed after it (a later line replacing "
            "c.JupyterHub.load_roles or the whole c.JupyterHub section). Reconciling with "
            "the hub and stopping reclaimed servers fail until it has them: call "
            "configure_jupyterhub after such lines.",
            ", ".join(missing),
        )
    else:
        log.info("gpuslice: the hub gives this service's token every scope it needs")
    return missing
