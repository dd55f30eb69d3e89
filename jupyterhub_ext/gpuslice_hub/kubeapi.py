"""Calls to the Kubernetes API (``kubernetes_asyncio``, the client KubeSpawner already
brings), shared by the Kubernetes job backend, the inventory and the mirror of the cluster's
pods: how to reach it, one call, every page of a list, and running them from the
scheduler's worker thread."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from gpuslice.errors import GPUSliceError

from .errors import ConfigError

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


def api_configuration(url: str = "", needed_by: str = "KubernetesClusterConfig.api_url") -> Any:
    """How to reach the API: ``url`` (e.g. behind ``kubectl proxy``), else the pod's
    service account, else the kubeconfig. None of them is a ConfigError naming
    ``needed_by`` (the setting that asked for the API): said at start, without a traceback."""
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import Configuration

    configuration = Configuration()
    if url:
        configuration.host = url.rstrip("/")
        return configuration
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            run_sync(config.load_kube_config(client_configuration=configuration))
    except (config.ConfigException, OSError, ValueError) as e:
        raise ConfigError(
            needed_by,
            f"the Kubernetes API cannot be reached: {e} (set "
            "c.KubernetesClusterConfig.api_url, run in a pod with a service account, or "
            "point KUBECONFIG at a kubeconfig)",
        ) from None
    return configuration


async def call(api_client: Any, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """One call of ``kubernetes_asyncio.client.<api>`` (``BatchV1Api``, ``CoreV1Api``)."""
    from kubernetes_asyncio import client

    return await getattr(getattr(client, api)(api_client), method)(
        *args, _request_timeout=REQUEST_TIMEOUT, **kwargs
    )


async def list_items(api_client: Any, api: str, method: str, **kwargs: Any) -> list[Any]:
    """Every item of a list call, page by page, as the API's JSON (not the client's models:
    thousands of pods parse several times faster, and the shapes are the API's own)."""
    items, _ = await list_versioned(api_client, api, method, **kwargs)
    return items


async def list_versioned(
    api_client: Any, api: str, method: str, **kwargs: Any
) -> tuple[list[Any], str]:
    """:func:`list_items` and the list's ``resourceVersion`` (where a watch of the same
    objects starts: every change after the list)."""
    from kubernetes_asyncio import client

    items: list[Any] = []
    token = None
    list_call = getattr(getattr(client, api)(api_client), method)
    while True:
        extra: dict[str, Any] = {"_continue": token} if token else {}
        response = await list_call(
            limit=PAGE,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
            **extra,
            **kwargs,
        )
        body = await response.read()
        if not 200 <= response.status < 300:
            raise _api_error(response, body)
        page = json.loads(body)
        items += page.get("items") or []
        metadata = page.get("metadata") or {}
        token = metadata.get("continue")
        if not token:
            # (a paged list is one snapshot: every page has the first page's version)
            return items, str(metadata.get("resourceVersion") or "")


def _api_error(response: Any, body: bytes) -> Exception:
    """An error answer as the client's ``ApiException`` (without the client's models the
    client checks no status: an error's ``Status`` body has no items, and must never read
    as an empty list)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    error = ApiException(status=response.status, reason=response.reason)
    # (the client's own errors carry the answer's text there: _api_message reads it)
    setattr(error, "body", body.decode(errors="replace"))  # noqa: B010
    return error


class WatchExpired(GPUSliceError):
    """The API server no longer has the changes since the version asked for (410 Gone):
    list again."""


async def watch_events(
    api_client: Any, api: str, method: str, version: str, seconds: int, **kwargs: Any
) -> AsyncIterator[dict[str, Any]]:
    """The changes after ``version`` of what ``method`` lists, as the API's watch events
    (``{"type": "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK", "object": ...}``), for at
    most ``seconds`` (the server then ends the stream: watch again from the last version).
    Raises :class:`WatchExpired` when the server answers 410, in the stream or before it."""
    from kubernetes_asyncio import client

    list_call = getattr(getattr(client, api)(api_client), method)
    response = await list_call(
        watch=True,
        resource_version=version,
        allow_watch_bookmarks=True,
        timeout_seconds=seconds,
        _preload_content=False,
        # no total: the stream lasts ``seconds``; a connection silent for longer than the
        # server's own end of it is broken
        _request_timeout=(REQUEST_TIMEOUT, seconds + REQUEST_TIMEOUT),
        **kwargs,
    )
    try:
        if response.status == 410:
            raise WatchExpired(f"resourceVersion {version} is too old")
        if not 200 <= response.status < 300:
            raise _api_error(response, await response.read())
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                if status.get("code") == 410:
                    raise WatchExpired(str(status.get("message") or "410 Gone"))
                raise RuntimeError(f"the watch failed: {status.get('message') or status}")
            yield event
    finally:
        response.release()


async def list_all(configuration: Any, api: str, method: str, **kwargs: Any) -> list[Any]:
    """:func:`list_items` with a client of its own (a periodic read on the service's loop)."""
    from kubernetes_asyncio import client

    async with client.ApiClient(configuration) as api_client:
        return await list_items(api_client, api, method, **kwargs)


class ApiSession:
    """One event loop (in a thread of its own) and one API client for many synchronous
    calls, e.g. the job scheduler's from its worker thread: a client made per call (an HTTP
    session, its connection pool and TLS context) cost most of a Job's create."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        # what runs on the loop until the session closes (watches)
        self._background: list[concurrent.futures.Future[Any]] = []

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                name = "kubernetes-api"
                threading.Thread(target=loop.run_forever, daemon=True, name=name).start()
                self._loop = loop
                atexit.register(self.close)
            return self._loop

    def close(self) -> None:
        """Close the client's connections and stop the loop (at exit)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        for running in self._background:
            running.cancel()
        self._background.clear()
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)

    def run(self, use: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """``use(api_client)`` run to completion on the session's loop."""
        return self.start(use).result()

    def start(self, use: Callable[[Any], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """``use(api_client)`` started on the session's loop; its future, not waited for."""

        async def with_client() -> T:
            if self._client is None:
                from kubernetes_asyncio import client

                self._client = client.ApiClient(self.configuration)
            return await use(self._client)

        return asyncio.run_coroutine_threadsafe(with_client(), self._running_loop())

    def keep_running(self, use: Callable[[Any], Coroutine[Any, Any, Any]]) -> None:
        """:meth:`start`, cancelled when the session closes (a watch)."""
        self._background.append(self.start(use))

    def call(self, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.run(lambda c: call(c, api, method, *args, **kwargs))

    def list(self, api: str, method: str, **kwargs: Any) -> list[Any]:
        return self.run(lambda c: list_items(c, api, method, **kwargs))
