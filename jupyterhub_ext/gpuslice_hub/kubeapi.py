"""Calls to the Kubernetes API (``kubernetes_asyncio``, the client KubeSpawner already
brings), shared by the Kubernetes job backend, the inventory and the mirror of the cluster's
pods: how to reach it, one call, every page of a list, and running them from the
scheduler's worker thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
REQUEST_TIMEOUT = 30  # seconds a call may take
PAGE = 500  # objects per list call (the API's ``limit``); the rest follow with ``continue``


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code (the scheduler's worker thread, or
    a thread of its own when called where an event loop runs)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def api_configuration(url: str = "") -> Any:
    """How to reach the API: ``url`` (e.g. behind ``kubectl proxy``), else the pod's
    service account, else the kubeconfig."""
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import Configuration

    configuration = Configuration()
    if url:
        configuration.host = url.rstrip("/")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        run_sync(config.load_kube_config(client_configuration=configuration))
    return configuration


async def call_api(configuration: Any, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """One call of ``kubernetes_asyncio.client.<api>`` (``BatchV1Api``, ``CoreV1Api``)."""
    from kubernetes_asyncio import client

    async with client.ApiClient(configuration) as api_client:
        return await getattr(getattr(client, api)(api_client), method)(
            *args, _request_timeout=REQUEST_TIMEOUT, **kwargs
        )


async def list_all(configuration: Any, api: str, method: str, **kwargs: Any) -> list[Any]:
    """Every item of a list call, page by page, as the API's JSON (not the client's models:
    thousands of pods parse faster, and the shapes are the API's own)."""
    from kubernetes_asyncio import client

    items: list[Any] = []
    token = None
    async with client.ApiClient(configuration) as api_client:
        call = getattr(getattr(client, api)(api_client), method)
        while True:
            extra: dict[str, Any] = {"_continue": token} if token else {}
            response = await call(
                limit=PAGE,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
                **extra,
                **kwargs,
            )
            page = json.loads(await response.read())
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
