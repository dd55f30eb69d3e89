"""The gpuslice hub service: a JupyterHub-managed Tornado application.

Started by the hub (an entry in ``c.JupyterHub.services``, see :mod:`gpuslice_hub.hubconfig`),
it reads its own config file, discovers the GPUs, opens the ledger and serves the REST API,
``/metrics`` and its pages under the service prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

import jinja2
from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from sqlalchemy.engine import make_url
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Bool, Dict, Enum, Float, Instance, Integer, List, Unicode, default
from traitlets.config import Application, Configurable

from gpuslice.gpu import GPUDiscoveryError, discover
from gpuslice.idle_policy import PolicyConfig, PolicyError
from gpuslice.jsonclient import JSONError
from gpuslice.model import Inventory
from gpuslice_spawner.kubernetes_resources import KubernetesResourcesConfig
from gpuslice_spawner.slurm_gres import SlurmGresConfig

from . import __version__
from .admin.capacity_check import CapacityCheckCache
from .admin.history import MIN_RETENTION_DAYS, run_pruner
from .admin.quota_suggestions import SuggestionSettings
from .admin.sampler import start_sampler
from .api.admin import admin_handlers
from .api.admin_views import (
    AdminCapacityHandler,
    AdminOvercommitHandler,
    AdminOverviewHandler,
    AdminPoolsHandler,
    AdminUsageHandler,
    QuotaSuggestionsHandler,
)
from .api.allocations import AllocationHandler, AllocationsHandler
from .api.base import NotFoundHandler
from .api.events import EventsHandler
from .api.inventory import HealthHandler, InventoryHandler, ProfilesHandler
from .api.jobs import job_handlers
from .api.metrics import MetricsHandler
from .api.pages import AdminPageHandler, HomeHandler
from .api.reclaim import IdlePolicyHandler, ReclaimHandler
from .api.usage_reports import UsageReportHandler
from .configcheck import check_settings
from .db import owner
from .db.engine import Database, open_database
from .db.models import utcnow
from .db.owner import LedgerHold, LedgerInUse, hold_ledger
from .db.schema import SchemaError, ensure_schema, safe_url, upgrade
from .db.short_writes import ShortWrites
from .errors import ConfigError
from .hubapi import RUNNING, STOPPED, HubAPI, IncompleteListing
from .hubparent import hub_parent, watch_hub
from .idle import effective_policy
from .inventory_refresh import Refresher, run_inventory_refresh
from .jobs.manager import JobManager
from .jobs.setup import start_jobs
from .kubeapi import api_configuration
from .kubecluster import (
    KubernetesClusterConfig,
    check_cluster_config,
    check_kubernetes_units,
    read_cluster_hosts,
    run_kubernetes_sync,
)
from .kubecluster import read_cluster as read_kubernetes_cluster
from .ledger import Ledger
from .loopwatch import GCPauses, LoopWatch, tune_garbage_collection
from .metrics import (
    BurstCollector,
    DefragCollector,
    OvercommitCollector,
    SplitPoolCollector,
    TimeWindowCollector,
    make_registry,
)
from .overcommit import MAX_RATIO, OvercommitHistory, OvercommitSettings
from .overrides import AdminSettings
from .placement import POLICIES, get_policy
from .profiles import parse_profiles
from .quotas import parse_quotas
from .scopes import SERVICE_SCOPES
from .secretfiles import check_secret_settings, is_sqlite, read_password_file, with_password
from .selfcheck import check_own_scopes
from .silent import SILENT_KIND, find_silent, silent_detail
from .slurminventory import check_slurm_units, read_slurm_hosts
from .slurmsync import run_slurm_sync
from .templating import check_template_paths, page_environment

PACKAGE = Path(__file__).resolve().parent
# Threads for usage reports (start_async): on SQLite they write one at a time anyway
REPORT_THREADS = 2


class GPUSliceService(Application):
    name = "gpuslice-hub-service"
    description = "The gpuslice hub service: GPU inventory, allocation ledger and REST API."
    version = __version__

    config_file = Unicode(
        "gpuslice_config.py",
        help="The config file to load (traitlets Python config, like jupyterhub_config.py).",
    ).tag(config=True)

    db_url = Unicode(
        "sqlite:///gpuslice.sqlite",
        help="""SQLAlchemy URL of the ledger database.

        SQLite (WAL mode) by default; use ``postgresql://user:password@host/db`` (psycopg 3)
        when the hub runs at scale. One service process per ledger: PostgreSQL does not
        make several replicas safe (the scheduler, reconciler and sampler have no leader, and
        pending preemptions live in the process), so the service holds its ledger while it
        runs (a lock file beside a SQLite ledger, an advisory lock on PostgreSQL) and a
        second one refuses to start, after waiting 20 s for one being replaced to exit.
        Leave the password out of it and name a ``db_password_file``: the service refuses
        to start when the config file that holds it can be read by group or others.""",
    ).tag(config=True)

    db_password_file = Unicode(
        "",
        help="""A file holding the ledger database's password (its first line), used with
        ``db_url`` written without one, e.g. ``postgresql://gpuslice@dbhost/gpuslice``.
        It must be readable by the service's account only (``chmod 600``): the service
        refuses to start otherwise, naming the file. Whoever reads the password can
        rewrite the ledger. Not for a SQLite ledger (no password).""",
    ).tag(config=True)

    gpu_backend = Enum(
        ["auto", "nvml", "static", "slurm", "kubernetes", "simulated"],
        default_value="auto",
        help="""How GPUs are discovered.

        ``nvml``: the GPUs of this host, through the NVIDIA driver; ``static``: the hosts
        declared in ``hosts`` (GPU nodes the hub cannot see); ``slurm``: Slurm's GPU nodes
        and their gres (``sinfo --json`` at start; ``c.SlurmGresConfig`` names the models,
        see the admin guide); ``kubernetes``: the cluster's GPU nodes (their allocatable
        resources and GPU feature discovery's labels, read at start; see the admin guide);
        ``simulated``: declared GPUs for
        trying gpuslice without any GPU, labelled as simulated everywhere; ``auto``: ``nvml``,
        and a clear error when no driver is found (never silently simulated).""",
    ).tag(config=True)

    hosts: List[Any] = List(
        help="""Hosts and their GPUs for the ``static`` and ``simulated`` backends, e.g.
        ``[{"name": "node1", "cpu_milli": 64000, "memory_mib": 512000, "gpus": [{"model":
        "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 2, "mig": ["3g.40gb",
        "2g.20gb", "1g.10gb", "1g.10gb"]}]}]``.""",
    ).tag(config=True)

    profiles: List[Any] = List(
        help="""What users may ask for. Each profile is a dict with ``name``, ``kind``
        (``mig`` with ``mig_profile``; ``share`` with ``gpu_milli`` and ``gpu_memory_mib``;
        ``gpu`` with ``count``), and optionally ``display_name``, ``description``,
        ``models`` (allowed GPU models), ``cpu_milli``, ``memory_mib``, ``idle_timeout``
        (seconds, 0 = never), ``groups`` (who may use it; empty = everyone),
        ``quota_weight`` and ``preempt_batch``.""",
    ).tag(config=True)

    quotas = Dict(
        help="""Limits on what a user or group holds at once: ``{"default_user": {...},
        "users": {name: {...}}, "groups": {name: {..., "borrow_from": [group, ...]}}}``,
        each limit with ``max_slices`` (weighted by the profile's quota_weight) and/or
        ``max_milli`` (GPU demand in milli-GPU). A group may borrow the unused quota of the
        groups in its ``borrow_from``.""",
    ).tag(config=True)

    job_backend = Enum(
        ["local", "slurm", "kubernetes"],
        default_value="local",
        help="""Where batch jobs run: ``local`` (a subprocess per job on the service host, the
        embedded default), ``slurm`` or ``kubernetes``. Finer job settings are on
        ``JobManager`` (``c.JobManager.preempt_grace`` …).""",
    ).tag(config=True)

    jobs_root = Unicode(
        "gpuslice-jobs",
        help="Folder (relative to the service's working directory) holding one folder per "
        "batch job: the notebook snapshot, checkpoints, output notebook and log.",
    ).tag(config=True)

    idle_policy = Dict(
        help="""Idle reclaim, served to every single-user server (``GET api/idle-policy``):
        ``action`` (``kernel``: shut down a kernel idle on its GPU; ``server``: stop the server
        once all its kernels are idle, freeing the slice), ``warning_lead`` and
        ``max_extension`` (keep-alive budget per idle period) in seconds, ``profiles``
        (per-profile overrides of these and of the profile's own ``idle_timeout``), and
        ``exempt_users`` / ``exempt_groups`` / ``exempt_profiles``, e.g. ``{"action": "server",
        "warning_lead": 600, "profiles": {"gpu-1": {"idle_timeout": 1800}},
        "exempt_groups": ["ops"]}``.""",
    ).tag(config=True)

    placement_policy = Unicode(
        "default",
        help=f"Placement policy for new slices: one of {', '.join(sorted(POLICIES))} "
        "(docs/benchmarks.md compares them on the openb traces).",
    ).tag(config=True)

    template_paths = List(
        Unicode(),
        help="Folders searched for the service's page templates (Jinja) before its own: a "
        "file named page.html, overview.html, admin.html or forbidden.html there replaces "
        'the built-in one, which it can extend as "gpuslice/<name>" (see the admin '
        "guide). Each folder must exist and hold at least one of them.",
    ).tag(config=True)

    metrics_require_auth = Bool(
        True, help="Require a token with the metrics (or admin) scope to scrape /metrics."
    ).tag(config=True)

    max_body_bytes = Integer(
        1024 * 1024,
        help="Largest request body the API accepts, in bytes (a larger one gets 413); "
        "job submissions, which carry a notebook, have ``max_notebook_bytes``.",
    ).tag(config=True)

    max_notebook_bytes = Integer(
        16 * 1024 * 1024,
        help="Largest job submission (the notebook with its outputs), in bytes.",
    ).tag(config=True)

    reconcile_interval = Float(
        60.0,
        help="Seconds between reconciliations of allocations against the hub's servers (0: off).",
    ).tag(config=True)

    slurm_sync_interval = Float(
        0.0,
        help="""Seconds between reads of what Slurm's running jobs hold (one
        ``squeue --json``), for sites whose GPUs Slurm also schedules: GPUs, MIG instances
        and shards held by jobs that did not come through gpuslice are held in the ledger
        as ``external`` allocations, so they are never offered, and released when Slurm
        frees them. The service's hosts must be named after the Slurm nodes and
        ``c.SlurmGresConfig`` must match gres.conf. 0: off (no Slurm).""",
    ).tag(config=True)

    reconcile_grace = Float(
        120.0,
        help="Seconds the reconciler leaves an allocation alone while the hub cannot tell "
        "about its server yet (granted after the hub was asked; a user the hub does not "
        "have); a server the hub reports stopped frees its slice at the next reconciliation "
        "whatever its age, and one it lists as starting keeps it. A server whose stop the "
        "service asked the hub for (an idle cull, its owner's release) and that still holds "
        "its slice this long after is asked to stop again.",
    ).tag(config=True)

    reclaim_silent_after = Float(
        600.0,
        help="""Stop the server of an interactive allocation under an idle policy when it has
        sent no usage report for its idle timeout plus this many seconds (0: never). Idle
        reclaim runs in the user's server; this catches a server whose extension was
        disabled or died. Checked every ``reconcile_interval``; an allocation younger than
        ``reconcile_grace`` (its server may still be starting) is left alone. It relies on the
        servers' usage reports (the server extension's ``usage_report_interval``, 60 s by default,
        must stay well below this).""",
    ).tag(config=True)

    inventory_refresh_interval = Float(
        300.0,
        help="""Seconds between reads of the inventory while the service runs, for
        ``gpu_backend`` ``nvml``/``auto``, ``slurm`` and ``kubernetes`` (0: read once at start).
        Hosts that joined are offered, hosts that left are marked absent (their holders keep
        their slices), a GPU whose MIG instances were repartitioned is described anew once
        no slice of it is held; a change is applied when two reads in a row agree. A
        ``static`` or ``simulated`` inventory is the ``hosts`` setting, read at start:
        setting this for them is refused.""",
    ).tag(config=True)

    usage_sample_interval = Float(
        300.0,
        help="Seconds between usage samples of the whole pool (capacity, allocation, "
        "utilization, fragmentation, queue) for the admin panel's plot (0: off).",
    ).tag(config=True)

    usage_retention_days = Float(
        90.0,
        help="Days of usage samples to keep; older ones are deleted about once a day.",
    ).tag(config=True)

    history_retention_days = Float(
        0.0,
        help="""Days of history to keep (0: keep everything). About once a day the service
        deletes events, the state history of jobs that ended, and allocations released
        longer ago than this; the folders of jobs that ended before then are removed from
        ``jobs_root`` (whether or not their outputs were copied back). What the deleted
        idle-reclaim events counted stays in the metrics' counters and the all-time
        reclaimed GPU-hours. At least 30: the admin panel's longest window.""",
    ).tag(config=True)

    quota_suggestion_days = Float(
        30.0,
        help="""Days of history the admin panel's quota suggestions look at: the most each
        user and group held at once over this many days. At most 90, and at most
        ``history_retention_days`` when that is set (older allocations are deleted).""",
    ).tag(config=True)

    quota_suggestion_factor = Float(
        1.2,
        help="A suggested quota is the most held at once times this factor, plus the buffers "
        "(``quota_suggestion_buffer_slices``, ``quota_suggestion_buffer_milli``). From 0.1 to 10.",
    ).tag(config=True)

    quota_suggestion_buffer_slices = Float(
        1.0,
        help="Slices added to a suggested quota's max_slices after the factor (>= 0); the sum "
        "is rounded up to whole slices.",
    ).tag(config=True)

    quota_suggestion_buffer_milli = Integer(
        250,
        help="Milli-GPU added to a suggested quota's max_milli after the factor (>= 0); the "
        "sum is rounded up to a multiple of 50 (a twentieth of a GPU).",
    ).tag(config=True)

    share_overcommit_ratio = Float(
        1.0,
        help="""Overcommit of time-sliced shares from history (1: off; at most 2). A holder
        whose observed peak memory over ``share_overcommit_days`` leaves room is charged
        less than their share promises — their peak times ``share_overcommit_headroom``,
        never less than the promise divided by this ratio — so a GPU takes up to this many
        times its memory in memory caps (and its compute in shares). Each holder's memory
        cap stays what they asked for and is still enforced per kernel; the admin panel's
        *Overcommit* section shows what was overcommitted and the memory-cap warnings and
        kills it cost. Only share profiles with a ``gpu_memory_mib`` cap are overcommitted,
        and only with gpuslice's own placement (not with Slurm or Kubernetes placing).""",
    ).tag(config=True)

    share_overcommit_headroom = Float(
        1.2,
        help="An overcommitted share is charged its holder's observed peak memory times this "
        "(from 1 to 3), rounded up, never more than its cap.",
    ).tag(config=True)

    share_overcommit_days = Float(
        30.0,
        help="""Days of history overcommit looks at: the most memory each user's allocations of
        each share profile reported. At most 90, and at most ``history_retention_days`` when
        that is set.""",
    ).tag(config=True)

    share_overcommit_min_hours = Float(
        24.0,
        help="Hours a user must have held a share profile (with usage reports) in "
        "``share_overcommit_days`` before their history is trusted to overcommit it (>= 1).",
    ).tag(config=True)

    ip = Unicode(help="Address to listen on (default: from JUPYTERHUB_SERVICE_URL).").tag(
        config=True
    )
    port = Integer(help="Port to listen on (default: from JUPYTERHUB_SERVICE_URL).").tag(
        config=True
    )

    service_name = Unicode(
        help="This service's name on the hub (default: $JUPYTERHUB_SERVICE_NAME)."
    ).tag(config=True)

    service_prefix = Unicode(help="URL prefix (default: $JUPYTERHUB_SERVICE_PREFIX).").tag(
        config=True
    )

    ledger = Instance(Ledger, allow_none=True)
    admin_settings: AdminSettings | None = None
    capacity: CapacityCheckCache | None = None
    suggestion_settings: SuggestionSettings
    overcommit_settings: OvercommitSettings
    inventory = Instance(Inventory, allow_none=True)
    db: Database | None = None
    short_writes: ShortWrites
    # the hold on the ledger (db/owner.py), let go at shutdown; None before it is held
    ledger_hold: LedgerHold | None = None
    # the JupyterHub process that started this service, read as main() begins (hubparent.py);
    # None: no hub to follow
    hub_pid: int | None = None
    jobs: JobManager | None = None
    started_at: datetime | None = None
    # when the last reconciliation with the hub completed (api/health says it)
    reconciled_at: datetime | None = None
    # when Slurm's holdings were last read and mirrored (slurm_sync_interval)
    slurm_synced_at: datetime | None = None
    # when the Kubernetes pods' holdings were last read and mirrored
    kubernetes_synced_at: datetime | None = None
    # allocation id -> when finish_stops last asked the hub to stop its server
    _stops_asked: dict[int, datetime]
    # the pages' templates, with the site's template_paths once the settings are loaded
    page_templates: jinja2.Environment

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._stops_asked = {}
        self.page_templates = page_environment()

    # what --help-all and --generate-config cover
    classes = [JobManager, SlurmGresConfig, KubernetesResourcesConfig, KubernetesClusterConfig]

    def config_classes(self) -> list[type[Configurable]]:
        """Every class that reads the service's config file (``check_settings``)."""
        return [type(self), *self.classes]

    subcommands = {
        "upgrade-db": (
            "gpuslice_hub.app.UpgradeDB",
            "Bring the ledger database to this version's schema (back it up first).",
        ),
    }

    generate_config = Bool(
        False,
        help="Print a gpuslice_config.py with every setting, its help and its default "
        "(commented out), and exit.",
    ).tag(config=True)

    flags = {
        **Application.flags,
        "generate-config": (
            {"GPUSliceService": {"generate_config": True}},
            "Print a commented gpuslice_config.py with every setting and its help, and exit.",
        ),
    }

    aliases = {
        "f": "GPUSliceService.config_file",
        "config": "GPUSliceService.config_file",
        "db-url": "GPUSliceService.db_url",
        "log-level": "Application.log_level",
    }

    @default("log_level")
    def _default_log_level(self) -> int:
        # INFO, not traitlets' WARN: the start-up summary and each request are logged
        return logging.INFO

    @default("service_name")
    def _default_service_name(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpuslice")

    @default("service_prefix")
    def _default_prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpuslice/")

    def _service_url(self) -> tuple[str, int]:
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        return url.hostname or "127.0.0.1", url.port or 10101

    @property
    def upgrade_command(self) -> str:
        return f"gpuslice-hub-service upgrade-db --config {self.config_file}"

    # -- startup -----------------------------------------------------------------------

    def load_settings(self) -> None:
        """Load the config file and validate it; ConfigError names the offending key."""
        if self.config_file and os.path.exists(self.config_file):
            self.load_config_file(self.config_file)
        elif self.config_file != self.__class__.config_file.default_value:
            raise ConfigError("config_file", f"{self.config_file} does not exist")
        # the ledger's password in no file (nor command line) other accounts can read
        check_secret_settings(
            self.db_url,
            self.db_password_file,
            self.config_file if self.config_file and os.path.exists(self.config_file) else None,
            "db_url" in self.cli_config.get("GPUSliceService", {}),
        )
        # a misspelled setting would leave the service running without it (traitlets warns)
        check_settings(self.config, self.config_classes(), self.config_file or "the config")
        self.parsed_profiles = parse_profiles(self.profiles)
        if not self.parsed_profiles:
            raise ConfigError("profiles", "no profiles configured: users could ask for nothing")
        self.parsed_quotas = parse_quotas(self.quotas)
        self.page_templates = check_template_paths(self.template_paths)
        self.idle_policy_config = self._parse_idle_policy()
        if self.usage_sample_interval < 0:
            raise ConfigError("usage_sample_interval", "must be >= 0 seconds (0: no samples)")
        if self.reclaim_silent_after < 0:
            raise ConfigError("reclaim_silent_after", "must be >= 0 seconds (0: never)")
        if self.reconcile_interval < 0:
            raise ConfigError("reconcile_interval", "must be >= 0 seconds (0: off)")
        if self.reconcile_interval == 0 and self.reclaim_silent_after > 0:
            # the check runs with the reconciler (_reconcile_loop)
            if "reclaim_silent_after" in self.config.GPUSliceService:
                raise ConfigError(
                    "reclaim_silent_after",
                    "does nothing with reconcile_interval = 0: servers that stopped reporting "
                    "are looked for by the reconciler. Turn it on, or set "
                    "reclaim_silent_after = 0",
                )
            self.log.warning(
                "reconcile_interval is 0: a server whose idle reclaim stopped reporting is "
                "never stopped by the service (reclaim_silent_after)"
            )
        if self.usage_retention_days <= 0:
            raise ConfigError("usage_retention_days", "must be > 0 days")
        if self.slurm_sync_interval < 0:
            raise ConfigError("slurm_sync_interval", "must be >= 0 seconds (0: off)")
        if self.slurm_sync_interval > 0 and shutil.which("squeue") is None:
            raise ConfigError(
                "slurm_sync_interval",
                "squeue is not on the service's PATH, so Slurm's holdings cannot be read",
            )
        # Slurm serves the slices (its inventory, its jobs, its mirror, or the servers'
        # gres names set here): a share is a whole number of its shards or MPS units
        check_slurm_units(
            SlurmGresConfig(parent=self).value(),
            self.parsed_profiles.values(),
            "slurm" in (self.gpu_backend, self.job_backend)
            or self.slurm_sync_interval > 0
            or bool(self.config.get("SlurmGresConfig")),
        )
        check_cluster_config(
            KubernetesClusterConfig(parent=self),
            next(
                (k for k in ("gpu_backend", "job_backend") if getattr(self, k) == "kubernetes"),
                "",
            ),
            set(self.config.get("KubernetesClusterConfig", {})),
        )
        # Kubernetes serves the slices: its inventory, its jobs, or the servers' resource
        # names set here (configure_jupyterhub hands them to GPUSliceKubeSpawner)
        check_kubernetes_units(
            KubernetesResourcesConfig(parent=self).value(),
            self.parsed_profiles.values(),
            "kubernetes" in (self.gpu_backend, self.job_backend)
            or bool(self.config.get("KubernetesResourcesConfig")),
        )
        if self.history_retention_days != 0 and self.history_retention_days < MIN_RETENTION_DAYS:
            raise ConfigError(
                "history_retention_days",
                f"must be 0 (keep everything) or at least {MIN_RETENTION_DAYS:g} days, the "
                "admin panel's longest window",
            )
        self.suggestion_settings = self._parse_suggestion_settings()
        self.overcommit_settings = self._parse_overcommit_settings()
        if self.inventory_refresh_interval < 0:
            raise ConfigError(
                "inventory_refresh_interval", "must be >= 0 seconds (0: at start only)"
            )
        if (
            self.gpu_backend in ("static", "simulated")
            and "inventory_refresh_interval" in self.config.GPUSliceService
            and self.inventory_refresh_interval > 0
        ):
            raise ConfigError(
                "inventory_refresh_interval",
                f"does nothing with gpu_backend = {self.gpu_backend!r}: its hosts are the "
                "hosts setting, read at start (restart the service to change them)",
            )
        for key in ("max_body_bytes", "max_notebook_bytes"):
            if not 1024 <= getattr(self, key) <= 1024**3:
                raise ConfigError(key, "must be from 1 KiB to 1 GiB")
        try:
            self.policy = get_policy(self.placement_policy)
        except ValueError as e:
            raise ConfigError("placement_policy", str(e)) from None

    def _parse_suggestion_settings(self) -> SuggestionSettings:
        days = self.quota_suggestion_days
        if not 0 < days <= 90:
            raise ConfigError("quota_suggestion_days", "must be > 0 and at most 90 days")
        if 0 < self.history_retention_days < days:
            raise ConfigError(
                "quota_suggestion_days",
                f"is longer than history_retention_days ({self.history_retention_days:g}): "
                "the allocations the suggestions would count are deleted before then",
            )
        if not 0.1 <= self.quota_suggestion_factor <= 10:
            raise ConfigError("quota_suggestion_factor", "must be from 0.1 to 10")
        if self.quota_suggestion_buffer_slices < 0:
            raise ConfigError("quota_suggestion_buffer_slices", "must be >= 0")
        if self.quota_suggestion_buffer_milli < 0:
            raise ConfigError("quota_suggestion_buffer_milli", "must be >= 0 milli-GPU")
        return SuggestionSettings(
            days,
            self.quota_suggestion_factor,
            self.quota_suggestion_buffer_slices,
            self.quota_suggestion_buffer_milli,
        )

    def _parse_overcommit_settings(self) -> OvercommitSettings:
        """The overcommit settings, refused when out of range or when they would do nothing."""
        ratio = self.share_overcommit_ratio
        if not 1.0 <= ratio <= MAX_RATIO:
            raise ConfigError("share_overcommit_ratio", f"must be from 1 (off) to {MAX_RATIO:g}")
        configured = self.config.GPUSliceService
        if ratio == 1.0:
            for key in (
                "share_overcommit_headroom",
                "share_overcommit_days",
                "share_overcommit_min_hours",
            ):
                if key in configured:
                    raise ConfigError(
                        key, "does nothing while share_overcommit_ratio is 1 (overcommit off)"
                    )
            return OvercommitSettings()
        if not 1.0 <= self.share_overcommit_headroom <= 3.0:
            raise ConfigError("share_overcommit_headroom", "must be from 1 to 3")
        days = self.share_overcommit_days
        if not 0 < days <= 90:
            raise ConfigError("share_overcommit_days", "must be > 0 and at most 90 days")
        if 0 < self.history_retention_days < days:
            raise ConfigError(
                "share_overcommit_days",
                f"is longer than history_retention_days ({self.history_retention_days:g}): "
                "the allocations it would look at are deleted before then",
            )
        if self.share_overcommit_min_hours < 1:
            raise ConfigError("share_overcommit_min_hours", "must be >= 1 hour")
        engines = [
            f"{key} = {getattr(self, key)!r}"
            for key in ("gpu_backend", "job_backend")
            if getattr(self, key) in ("slurm", "kubernetes")
        ]
        if engines:
            raise ConfigError(
                "share_overcommit_ratio",
                f"is applied by gpuslice's own placement; with {' and '.join(engines)} the "
                "engine counts the shares (Slurm's shard counts, the device plugin's replicas)",
            )
        if not any(
            p.kind == "share" and p.gpu_memory_mib > 0 for p in self.parsed_profiles.values()
        ):
            raise ConfigError(
                "share_overcommit_ratio",
                "no profile could be overcommitted: only share profiles with a gpu_memory_mib "
                "cap are",
            )
        return OvercommitSettings(
            ratio, self.share_overcommit_headroom, days, self.share_overcommit_min_hours
        )

    def _parse_idle_policy(self) -> PolicyConfig:
        try:
            config = PolicyConfig.parse(self.idle_policy)
        except PolicyError as e:
            raise ConfigError(e.key, e.message) from None
        if "idle_timeout" in self.idle_policy:
            # every profile has its own idle_timeout, which a default here never overrides
            raise ConfigError(
                "idle_policy.idle_timeout",
                "would never apply: set idle_timeout on each profile, or per profile in "
                "idle_policy['profiles']",
            )
        for name in config.profiles:
            if name not in self.parsed_profiles:
                raise ConfigError(f"idle_policy.profiles.{name}", "no such profile")
        for name in config.exempt_profiles:
            if name not in self.parsed_profiles:
                raise ConfigError("idle_policy.exempt_profiles", f"no such profile {name!r}")
        lead = self.idle_policy.get("warning_lead")
        for name, profile in self.parsed_profiles.items() if lead is not None else ():
            # a lead as long as the timeout is not one: the policy would warn halfway instead
            own = config.profiles.get(name, {})
            timeout = own.get("idle_timeout", profile.idle_timeout)
            if "warning_lead" not in own and timeout and lead >= timeout:
                raise ConfigError(
                    "idle_policy.warning_lead",
                    f"{lead:g} s is not shorter than profile {name}'s idle_timeout "
                    f"({timeout:g} s): set a shorter one, or one for {name} in "
                    "idle_policy['profiles']",
                )
        return config

    def discover(self) -> Inventory:
        # the host list at start; every refresh after that says only what changed
        level = logging.INFO if self.inventory is None else logging.DEBUG
        hosts = self.hosts if self.gpu_backend in ("static", "simulated") else None
        if self.gpu_backend == "slurm":
            if self.hosts:
                raise ConfigError("hosts", "is read from Slurm with gpu_backend = 'slurm'")
            gres = SlurmGresConfig(parent=self)
            # the burst partition's nodes are capacity bought elsewhere, not this cluster's
            burst = self.config.get("JobManager", {}).get("burst_partition") or ""
            hosts = read_slurm_hosts(gres.value(), gres.gpu_memory_mib, leave_out=[burst])
            self.log.log(level, "inventory from Slurm: %s", ", ".join(h["name"] for h in hosts))
            # declared from what Slurm said; named for where it came from (what the start
            # line, /api/health and the admin panel show)
            return dataclasses.replace(discover("static", hosts), backend="slurm")
        if self.gpu_backend == "kubernetes":
            if self.hosts:
                raise ConfigError(
                    "hosts", "is read from the cluster with gpu_backend = 'kubernetes'"
                )
            hosts = self._kubernetes_hosts()
            self.log.log(
                level, "inventory from Kubernetes: %s", ", ".join(h["name"] for h in hosts)
            )
            return dataclasses.replace(discover("static", hosts), backend="kubernetes")
        try:
            return discover(self.gpu_backend, hosts or None)
        except ConfigError:
            raise  # names its key (hosts[0].gpus[1].mig, ...)
        except GPUDiscoveryError as e:
            raise ConfigError("gpu_backend", str(e)) from None

    def ledger_url(self) -> str:
        """``db_url``, with the password of ``db_password_file`` when one is named (read
        now, and refused when other accounts can read the file)."""
        if not self.db_password_file or is_sqlite(self.db_url):
            return self.db_url
        return with_password(self.db_url, read_password_file(self.db_password_file))

    def open_ledger(self) -> None:
        self.db = open_database(self.ledger_url())
        # one service per ledger, before anything reads or migrates it (db/owner.py)
        self.ledger_hold = hold_ledger(self.db, safe_url(self.db_url))
        private_sqlite_files(self.db_url)
        ensure_schema(self.db, self.upgrade_command)
        self.ledger = Ledger(
            self.db,
            self.parsed_profiles,
            self.parsed_quotas,
            self.policy,
            on_refusal=lambda profile, code: self.refusals.labels(profile, code).inc(),
        )
        self.ledger.overcommit = OvercommitHistory(self.overcommit_settings)
        learned = self.ledger.learn_from_history()
        if learned:
            self.log.info("placement policy: learned from the last %d requests", learned)
        self.admin_settings = AdminSettings(self.db)
        self.short_writes = ShortWrites(self.db)

    def make_app(self) -> web.Application:
        prefix = self.service_prefix
        hub_auth = HubOAuth(cache_max_age=60)
        api = url_path_join(prefix, "api")
        handlers: list[Any] = [
            (prefix, HomeHandler),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
            (url_path_join(api, "health"), HealthHandler),
            (url_path_join(api, "inventory"), InventoryHandler),
            (url_path_join(api, "profiles"), ProfilesHandler),
            (url_path_join(api, "allocations"), AllocationsHandler),
            (url_path_join(api, r"allocations/(\d+)"), AllocationHandler),
            (url_path_join(api, r"allocations/(\d+)/reclaim"), ReclaimHandler),
            (url_path_join(api, "idle-policy"), IdlePolicyHandler),
            (url_path_join(api, "events"), EventsHandler),
            (url_path_join(api, r"allocations/(\d+)/usage"), UsageReportHandler),
            *admin_handlers(api),
            (url_path_join(api, "admin/overview"), AdminOverviewHandler),
            (url_path_join(api, "admin/usage"), AdminUsageHandler),
            (url_path_join(api, "admin/capacity"), AdminCapacityHandler),
            (url_path_join(api, "admin/pools"), AdminPoolsHandler),
            (url_path_join(api, "admin/overcommit"), AdminOvercommitHandler),
            (url_path_join(api, "admin/quota-suggestions"), QuotaSuggestionsHandler),
            (url_path_join(prefix, "admin"), AdminPageHandler),
            (url_path_join(prefix, "metrics"), MetricsHandler),
            *job_handlers(api),
        ]
        return web.Application(
            handlers,
            default_handler_class=NotFoundHandler,
            gpuslice=self,
            hub_auth=hub_auth,
            cookie_secret=os.urandom(32),
            static_path=str(PACKAGE / "static"),
            gpuslice_templates=self.page_templates,
            static_url_prefix=url_path_join(prefix, "static/"),
            log_function=self._log_request,
        )

    def _log_request(self, handler: web.RequestHandler) -> None:
        status = handler.get_status()
        level = logging.DEBUG if status < 400 and handler.request.method == "GET" else logging.INFO
        if status >= 500:
            level = logging.ERROR
        self.log.log(
            level,
            "%d %s %s %.1fms",
            status,
            handler.request.method,
            handler.request.uri,
            1000 * handler.request.request_time(),
        )

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.subapp is not None or self.generate_config:
            return  # a subcommand (upgrade-db) loads what it needs; a config needs nothing
        logging.getLogger("gpuslice").setLevel(cast(int, self.log_level))
        self.load_settings()
        self.hub_api = HubAPI()

    async def start_async(self) -> None:
        # Whatever the service writes (the SQLite ledger and its WAL, job folders before
        # they are handed to their owners) is its own: unreadable to users' code.
        os.umask(0o077)
        # before anything starts: a mirror that cannot reach the API is a config error
        mirror = self._mirror_configuration()
        self.inventory = self.discover()
        self.open_ledger()
        assert self.ledger is not None
        # the check reads the usage samples: it cannot change faster than they are taken
        self.capacity = CapacityCheckCache(self.ledger, self.usage_sample_interval or 300.0)
        self.registry, self.refusals = make_registry(self.ledger, self.capacity)
        # Usage reports have threads of their own: 2 800 a minute at 200 hosts, each a
        # write that may wait for SQLite's one writer. In the shared pool (6 threads on 2
        # CPUs) a burst of them waiting could take every thread, and a spawn or a spawn
        # form would queue behind them; here they queue behind each other.
        self.report_pool = ThreadPoolExecutor(REPORT_THREADS, "gpuslice-usage-reports")
        self._loop_watch = asyncio.ensure_future(LoopWatch(self.registry).run())
        self._gc_pauses = GCPauses(self.registry)
        self._gc_pauses.start()
        self.ledger.sync_inventory(self.inventory)
        for name in self.ledger.never_placed():
            # a warning, not a refusal: hosts that are down now may hold it when they return
            self.log.warning(
                "profile %s: no host of this inventory can hold it (%s%s), so no one can "
                "have it: the spawn form shows it as unavailable until a host that can joins",
                name,
                self.parsed_profiles[name].summary(),
                "; models " + ", ".join(self.parsed_profiles[name].models)
                if self.parsed_profiles[name].models
                else "",
            )
        self.started_at = utcnow()
        label = " (SIMULATED GPUs — not real hardware)" if self.inventory.simulated else ""
        gpus = self.inventory.gpus()
        self.log.info(
            "gpuslice %s: backend %s%s, %d host(s), %d GPU(s), %d MIG instance(s); ledger %s",
            __version__,
            self.inventory.backend,
            label,
            len(self.inventory.hosts),
            len(gpus),
            sum(len(g.mig_instances) for g in gpus),
            safe_url(self.db_url),
        )
        self.jobs = start_jobs(self)
        if self.jobs is not None and self.jobs.windows:
            self.registry.register(TimeWindowCollector(self.jobs))
        if self.ledger.pools is not None:
            self.registry.register(SplitPoolCollector(self.ledger))
        if self.overcommit_settings.on:
            self.registry.register(OvercommitCollector(self.ledger))
        if self.jobs is not None and self.jobs.defragment_moves_per_hour:
            self.registry.register(DefragCollector(self.jobs))
        if self.jobs is not None and self.jobs.burst_partition:
            self.registry.register(BurstCollector(self.jobs))
        ip, port = self._service_url()
        # Tornado refuses anything larger before buffering it; the handlers apply the limits.
        limit = max(self.max_body_bytes, self.max_notebook_bytes)
        server = HTTPServer(self.make_app(), xheaders=True, max_body_size=limit)
        server.listen(self.port or port, self.ip or ip)
        self.log.info(
            "listening on http://%s:%d%s", self.ip or ip, self.port or port, self.service_prefix
        )
        if self.hub_api.configured:
            # (a task: the hub may still be starting; the check says so and goes on)
            needed = [s.format(name=self.service_name or "gpuslice") for s in SERVICE_SCOPES]
            self._scope_check = asyncio.ensure_future(
                check_own_scopes(self.hub_api, needed, self.log)
            )
        if self.reconcile_interval > 0 and self.hub_api.configured:
            self._reconciler = asyncio.ensure_future(self._reconcile_loop())
        self._sampler = start_sampler(
            self.ledger, self.usage_sample_interval, self.usage_retention_days, self.log
        )
        self._pruner = None
        if self.history_retention_days > 0:
            self._pruner = asyncio.ensure_future(
                run_pruner(self.ledger, self.history_retention_days, self.log)
            )
        self._slurm_sync = None
        if self.slurm_sync_interval > 0:
            gres = SlurmGresConfig(parent=self).value()
            jobs = self.jobs
            self._slurm_sync = asyncio.ensure_future(
                run_slurm_sync(
                    self.ledger,
                    self.slurm_sync_interval,
                    gres,
                    self.log,
                    self._slurm_synced,
                    # Slurm schedules the batch jobs: the job pass records those by id
                    jobs.jobs_accounted
                    if jobs is not None and self.job_backend == "slurm"
                    else None,
                    # ... and by name those whose Slurm id it does not know yet
                    jobs.slurm_jobs_submitting
                    if jobs is not None and self.job_backend == "slurm"
                    else None,
                )
            )
        self._kubernetes_sync = self._start_kubernetes_sync(mirror)
        self._inventory_refresh = None
        if self.inventory_refresh_interval > 0 and self.gpu_backend not in (
            "static",
            "simulated",
        ):
            refresher = Refresher(
                self.inventory, self.discover, self._apply_inventory, self._held_uuids, self.log
            )
            self._inventory_refresh = asyncio.ensure_future(
                run_inventory_refresh(self.inventory_refresh_interval, refresher)
            )
        # Everything the start built lives as long as the process: no later garbage
        # collection needs to walk it again; and collections are made rarer (loopwatch.py)
        frozen = tune_garbage_collection()
        self.log.debug("%d objects of the start frozen out of garbage collection", frozen)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        lost: list[LedgerInUse] = []
        self._hold_watch = asyncio.ensure_future(self._watch_hold(stop, lost))
        # a managed service outlives a hub killed outright unless it watches (hubparent.py)
        self._parent_watch = (
            asyncio.ensure_future(watch_hub(self.hub_pid, stop.set, self.log))
            if self.hub_pid is not None
            else None
        )
        await stop.wait()
        self.log.info("gpuslice service stopping")
        server.stop()
        tasks = (
            getattr(self, "_reconciler", None),
            self._sampler,
            self._pruner,
            self._slurm_sync,
            self._kubernetes_sync,
            self._inventory_refresh,
            self._loop_watch,
            self._hold_watch,
            self._parent_watch,
        )
        for task in tasks:
            if task is not None:
                task.cancel()
        self._gc_pauses.stop()
        self.report_pool.shutdown(wait=False, cancel_futures=True)
        if self.db is not None:
            self.db.dispose()
        if self.ledger_hold is not None:
            self.ledger_hold.let_go()
        if lost:
            raise lost[0]  # (main() says it, and exits with 1 for the hub to see)

    def _held_uuids(self) -> set[str]:
        """The GPUs and MIG instances an active allocation holds."""
        assert self.ledger is not None
        _, _, active = self.ledger.snapshot()
        return {u for a in active for c in a.claims for u in (c.gpu_uuid, c.mig_uuid) if u}

    def _apply_inventory(self, inventory: Inventory) -> None:
        assert self.ledger is not None
        self.ledger.sync_inventory(inventory)
        self.inventory = inventory
        pools = self.ledger.pools
        if pools is not None:
            # checked at start; a host added or gone since is placed by the patterns as
            # they stand, and an admin is told when they no longer say what they did
            try:
                pools.check_inventory((g.host, g.uuid) for g in inventory.gpus())
            except ConfigError as e:
                self.log.error("after the inventory changed: %s", e)

    def _slurm_synced(self) -> None:
        self.slurm_synced_at = utcnow()

    def _kubernetes_synced(self) -> None:
        self.kubernetes_synced_at = utcnow()

    def _kubernetes_hosts(self) -> list[dict[str, Any]]:
        """The cluster's GPU nodes as hosts; a model a profile names keeps its NVML name."""
        cluster = KubernetesClusterConfig(parent=self)
        known = {m for p in self.parsed_profiles.values() for m in p.models}
        return read_cluster_hosts(
            api_configuration(cluster.api_url, needed_by="gpu_backend"),
            KubernetesResourcesConfig(parent=self).value(),
            cluster.gpu_memory_mib,
            sorted(known),
        )

    def _mirror_configuration(self) -> Any:
        """How the mirror of the cluster's pods reaches the API (None: no mirror)."""
        cluster = KubernetesClusterConfig(parent=self)
        if cluster.sync_interval <= 0:
            return None
        return api_configuration(cluster.api_url, needed_by="KubernetesClusterConfig.sync_interval")

    def _start_kubernetes_sync(self, configuration: Any) -> asyncio.Future | None:
        """The mirror of what the cluster's other pods hold (sync_interval > 0)."""
        if configuration is None:
            return None
        cluster = KubernetesClusterConfig(parent=self)
        assert self.ledger is not None
        res = KubernetesResourcesConfig(parent=self).value()
        jobs = self.jobs

        def accounted() -> set[str]:
            # the batch jobs' pods the job pass records itself (Kubernetes schedules them)
            if jobs is None or self.job_backend != "kubernetes":
                return set()
            return jobs.jobs_accounted("k8s_job")

        return asyncio.ensure_future(
            run_kubernetes_sync(
                self.ledger,
                cluster.sync_interval,
                lambda: read_kubernetes_cluster(configuration, res, accounted()),
                self.log,
                self._kubernetes_synced,
            )
        )

    async def reconcile_once(self) -> list[int]:
        """Release the slices of interactive servers the hub no longer has.

        The hub is the truth: its paged listing is read to the end (or nothing is concluded),
        and each server missing from it is asked about on its own before its slice is given
        away, so a user who moved between pages while they were read keeps their slice. A
        server the hub reports stopped (it has the user; the server is not running, starting
        or stopping) frees the slices granted before the hub was asked, whatever their age:
        after a clean hub restart, which stops the service before the servers (their
        spawners' releases fail), at the restarted service's first pass. ``reconcile_grace``
        protects only what the hub cannot tell about yet: a grant made after it was asked,
        a user it does not have.
        """
        assert self.ledger is not None
        grace = timedelta(seconds=self.reconcile_grace)
        existing = await self.hub_api.existing_servers()
        missing = await asyncio.to_thread(self.ledger.servers_missing, existing, timedelta(0))
        stopped: dict[tuple[str, str], datetime] = {}
        unknown = set()
        for user, server in sorted(missing):
            asked = utcnow()  # (before the question: the answer is at least this recent)
            status = await self.hub_api.server_status(user, server)
            if status == STOPPED:
                stopped[(user, server)] = asked
            elif status != RUNNING:
                unknown.add((user, server))  # released once past the grace, as before
        released = await asyncio.to_thread(
            self.ledger.reconcile_servers, existing, grace, only=unknown, stopped=stopped
        )
        self.reconciled_at = utcnow()
        if released:
            self.log.info(
                "reconciled: released allocations %s (their servers are stopped or gone on "
                "the hub)",
                released,
            )
        return released

    async def reclaim_silent(self, now: datetime | None = None) -> list[int]:
        """Stop the servers that hold a slice under an idle policy but stopped reporting."""
        assert self.ledger is not None
        if not self.reclaim_silent_after:
            return []
        store = self.admin_settings

        def policy_for(a: Any) -> Any:
            return effective_policy(
                self.idle_policy_config, self.parsed_profiles, a.user, a.groups, a.profile, None
            )

        found = find_silent(
            self.ledger,
            policy_for,
            lambda user: store is not None and store.exemption(user) is not None,
            self.reclaim_silent_after,
            now or utcnow(),
            # a spawn in progress has made no report yet, as for the reconciler
            min_age=self.reconcile_grace,
        )
        stopped = []
        for item in found:
            a = item.allocation
            reason = (
                f"its server sent no usage report for {item.silent_seconds / 60:.0f} min "
                f"(idle timeout {item.idle_timeout / 60:.0f} min): idle reclaim cannot "
                "run in it"
            )
            detail = silent_detail(item)
            # once per slice, across the service's restarts; a stop that does not happen is
            # asked again by finish_stops, as for every stop the service requests
            _event, new = self.ledger.record_stop_request(
                SILENT_KIND, a.user, "service", reason, detail
            )
            if not new:
                continue
            self.log.warning("stopping %s's server %r: %s", a.user, a.server_name, reason)
            try:
                await self.hub_api.stop_server(a.user, a.server_name)
            except JSONError as e:
                if e.status != 404:  # already gone: nothing to stop
                    self.log.error("could not stop %s's silent server: %s", a.user, e)
                    continue
            stopped.append(a.id)
        return stopped

    async def finish_stops(self, now: datetime | None = None) -> list[int]:
        """Ask the hub again to stop each server whose stop the service recorded (an idle
        cull, its owner's release, a silent server's reclaim) more than ``reconcile_grace``
        ago and that still holds its slice: the service may have stopped between recording
        the request and asking the hub (a cull the person was told of, and a slice still
        held), or the hub's stop did not happen. Each is asked at most once a grace."""
        assert self.ledger is not None
        now = now or utcnow()
        grace = timedelta(seconds=self.reconcile_grace)
        pending = await asyncio.to_thread(self.ledger.pending_stops, now - grace)
        self._stops_asked = {i: t for i, t in self._stops_asked.items() if now - t < grace}
        asked = []
        for alloc_id, user, server in pending:
            if alloc_id in self._stops_asked:
                continue
            self._stops_asked[alloc_id] = now
            self.log.warning(
                "asking the hub again to stop %s's server %r: its stop was requested and "
                "it still holds allocation %d",
                user,
                server,
                alloc_id,
            )
            try:
                await self.hub_api.stop_server(user, server)
            except JSONError as e:
                if e.status != 404:  # already gone: the spawner releases the slice
                    self.log.error("could not stop %s's server: %s", user, e)
                    continue
            asked.append(alloc_id)
        return asked

    async def _watch_hold(self, stop: asyncio.Event, lost: list[LedgerInUse]) -> None:
        """Every ``owner.CHECK_SECONDS``: this service still holds its ledger, or takes it
        again if it lost it and no one else took it; if another service did, this one stops
        (``lost``) rather than run a second scheduler on the ledger."""
        hold = self.ledger_hold
        assert hold is not None
        # a thread of its own: never queued behind ledger calls that wait for the writer
        checker = ThreadPoolExecutor(1, "gpuslice-ledger-hold")
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(owner.CHECK_SECONDS)
                try:
                    what = await loop.run_in_executor(checker, hold.check)
                except LedgerInUse as e:
                    self.log.error(
                        "this service lost its hold on the ledger, and is stopping: %s", e
                    )
                    lost.append(e)
                    stop.set()
                    return
                except Exception:
                    self.log.exception("checking this service's hold on the ledger failed")
                    continue
                if what is not None:
                    self.log.warning("%s", what)
        finally:
            checker.shutdown(wait=False)

    async def _reconcile_loop(self) -> None:
        """Reconcile every ``reconcile_interval``. Until a pass succeeds (at startup the hub's
        API may not answer yet; after a hub restart it comes up after its services) and after
        a failure, retry within seconds: slices of servers that are gone stay unusable until
        a pass has run."""
        retry = 1.0
        while True:
            try:
                await self.reconcile_once()
                await self.reclaim_silent()
                await self.finish_stops()
            except Exception as e:
                wait = min(retry, self.reconcile_interval)
                retry = min(retry * 2, 30.0)
                if isinstance(e, JSONError | IncompleteListing):
                    self.log.warning(
                        "reconciliation with the hub failed (%s); retry in %gs", e, wait
                    )
                else:
                    self.log.exception("reconciliation with the hub failed; retry in %gs", wait)
                await asyncio.sleep(wait)
                continue
            retry = 1.0
            await asyncio.sleep(self.reconcile_interval)

    def start(self) -> None:
        if self.subapp is not None:
            self.subapp.start()
            return
        asyncio.run(self.start_async())


class UpgradeDB(Application):
    """``gpuslice-hub-service upgrade-db``: bring the ledger to this version's schema."""

    name = "gpuslice-hub-service upgrade-db"
    description = (
        "Bring the ledger database (db_url of the config file) to this version's schema. "
        "Back it up first; the service refuses to start on an older schema until this ran."
    )
    aliases = {
        "f": "GPUSliceService.config_file",
        "config": "GPUSliceService.config_file",
        "db-url": "GPUSliceService.db_url",
    }
    classes = [GPUSliceService]

    def start(self) -> None:
        # the GPUSliceService that ran this subcommand (not an isinstance check: under
        # ``python -m gpuslice_hub.app`` that class is ``__main__``'s)
        service: Any = self.parent
        service.update_config(self.config)  # what was given after the subcommand
        service.load_settings()
        db = open_database(service.ledger_url())
        try:
            # never under a running service (db/owner.py): it waits for no one
            try:
                hold = hold_ledger(db, safe_url(service.db_url), wait=0)
            except LedgerInUse as e:
                raise LedgerInUse(e.shown_url, e.holder, upgrading=True) from None
            try:
                upgrade(db)
            finally:
                hold.let_go()
        finally:
            db.dispose()
        service.log.info("database %s is at the newest schema", safe_url(service.db_url))


def private_sqlite_files(db_url: str) -> None:
    """A ledger created by an older version (or another umask) may be world-readable."""
    path = make_url(db_url).database if db_url.startswith("sqlite") else None
    if not path or path == ":memory:":
        return
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path + suffix, 0o600)


def main(argv: list[str] | None = None) -> None:
    # Which hub started this service, asked first: the start that follows can take half a
    # minute (the ledger's lock, discovery), and a hub killed meanwhile is then seen gone
    # at once, not taken for no hub at all (hubparent.py).
    hub_pid = hub_parent()
    argv = list(sys.argv[1:] if argv is None else argv)
    app = GPUSliceService()
    app.hub_pid = hub_pid
    try:
        app.initialize(argv)
        if app.generate_config:
            # every setting with its help, commented out: a starting gpuslice_config.py
            print(app.generate_config_file())
            return
        app.start()
    except (ConfigError, SchemaError, LedgerInUse) as e:
        print(
            f"gpuslice: invalid configuration: {e}"
            if isinstance(e, ConfigError)
            else f"gpuslice: {e}",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
