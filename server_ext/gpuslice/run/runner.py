"""Execute a job's notebook cell by cell, checkpointing, and stop cleanly when preempted.

The kernel runs in its own session (jupyter_client starts it so), so a signal sent to the
runner never reaches it; the runner forwards the preemption as SIGUSR1, which
``gpuslice.checkpoint`` turns into "save at the next step, then stop the cell".
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import nbformat
from jupyter_core.paths import jupyter_runtime_dir
from jupyter_core.utils import ensure_async
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

from .jobdir import EXIT_FAILED, EXIT_PREEMPTED, JobDir, write_json_atomic
from .params import inject, is_injected, parameter_warnings
from .usage import JobUsage, default_usage_interval

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Printed output copied into the job log (the jobs panel shows the log while the job
# runs); beyond this the log says so once and the output notebook has the rest.
MAX_LOGGED_OUTPUT = 1 << 20


class _LiveOutputClient(NotebookClient):
    """A NotebookClient that also hands each printed chunk to ``on_stream`` as it comes."""

    on_stream: Any = None

    def output(self, outs: Any, msg: dict[str, Any], display_id: Any, cell_index: int) -> Any:
        if msg.get("msg_type") == "stream" and self.on_stream is not None:
            content = msg.get("content") or {}
            self.on_stream(str(content.get("name", "")), str(content.get("text", "")))
        return super().output(outs, msg, display_id, cell_index)


SETUP = (
    "import gpuslice.checkpoint as __gpuslice_ckpt\n__gpuslice_ckpt.install_preemption_handler()"
)


class Runner:
    def __init__(self, job_dir: Path, usage_interval: float | None = None) -> None:
        self.jd = JobDir(job_dir)
        interval = default_usage_interval() if usage_interval is None else usage_interval
        self.usage = JobUsage(self.jd, interval)
        self.spec = self.jd.spec()
        self.interval = float(self.spec.get("checkpoint_interval", 600))
        self.preempt_at: float | None = None
        # the cells done at the last namespace snapshot this run took (None: none yet)
        self.snapshot_cells: int | None = None
        self.last_snapshot = 0.0
        self.client: NotebookClient | None = None
        self.kernel_ready = False
        self.current_cell = 0
        self.logged_output = 0
        self.attempt = 0  # this run's number among the job's runs (set as it starts)

    # -- notebook -------------------------------------------------------------------------

    def _notebook(self) -> tuple[nbformat.NotebookNode, bool]:
        """The working notebook: the output so far when resuming, else the input with
        parameters injected."""
        if self.jd.output_path.exists() and self.jd.state().get("cells_done"):
            return nbformat.read(self.jd.output_path, as_version=4), True
        nb = nbformat.read(self.jd.input_path, as_version=4)
        if self._is_python(nb):
            parameters = self.spec.get("parameters") or {}
            for warning in parameter_warnings(nb, parameters):
                self.jd.log(f"warning: {warning}")
            inject(nb, parameters)
        elif self.spec.get("parameters"):
            self.jd.log("parameters not injected (not a Python kernel); see $GPUSLICE_PARAMETERS")
        return nb, False

    @staticmethod
    def _is_python(nb: nbformat.NotebookNode) -> bool:
        lang = nb.metadata.get("language_info", {}).get("name") or nb.metadata.get(
            "kernelspec", {}
        ).get("language", "python")
        return str(lang).lower() == "python"

    def _write_output(self, nb: nbformat.NotebookNode) -> None:
        tmp = self.jd.output_path.with_name(".output.ipynb.tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, self.jd.output_path)

    def _workdir(self) -> str:
        """Where the notebook runs: its own folder (as submitted from the lab) when this
        host can enter it, else the job's folder, and the log says which."""
        wanted = self.spec.get("workdir")
        if isinstance(wanted, str) and wanted:
            if os.path.isdir(wanted) and os.access(wanted, os.X_OK | os.W_OK):
                self.jd.log(f"running in the notebook's folder {wanted}")
                return wanted
            self.jd.log(
                f"the notebook's folder {wanted} is not reachable here: running in the job's "
                "folder, so paths relative to the notebook will not resolve"
            )
        return str(self.jd.root)

    def _log_output(self, name: str, text: str) -> None:
        """Copy a cell's printed output into the job log, line by line, up to a limit."""
        if self.logged_output >= MAX_LOGGED_OUTPUT:
            return
        self.logged_output += len(text)
        if self.logged_output >= MAX_LOGGED_OUTPUT:
            self.jd.log("output beyond 1 MiB is not copied here: see the output notebook")
            return
        where = f"cell {self.current_cell + 1}" + (" stderr" if name == "stderr" else "")
        try:
            for line in text.rstrip("\n").split("\n"):
                self.jd.log(f"[{where}] {line}")
        except OSError:
            pass  # the log is for people; the run goes on without it

    # -- signals --------------------------------------------------------------------------

    def _on_preempt(self, signum: int) -> None:
        if self.preempt_at is not None:
            return
        self.preempt_at = time.time()
        # (what happens depends on the cell: say it, not "checkpointing", which a cell that
        # never calls gpuslice.checkpoint does not do)
        self.jd.log(
            f"preemption signal {signal.Signals(signum).name}: the run stops at this cell's "
            "next gpuslice.checkpoint step, or at the end of the cell, after saving; if "
            "neither comes within the grace period it is killed, and the work since the last "
            "save is redone"
        )
        self._forward()

    def _forward(self) -> None:
        # Only once the kernel has our SIGUSR1 handler: before that the signal would kill it
        # (the cell loop sees ``preempt_at`` at the next boundary anyway).
        pid = self._kernel_pid()
        if pid and self.is_python and self.kernel_ready:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)

    def _kernel_pid(self) -> int | None:
        km = self.client.km if self.client else None
        proc = getattr(getattr(km, "provisioner", None), "process", None)
        return getattr(proc, "pid", None)

    # -- kernel helpers -------------------------------------------------------------------

    async def _eval(self, code: str, expr: str) -> Any:
        assert self.client is not None and self.client.kc is not None
        reply = await self.client.kc.execute_interactive(  # type: ignore[attr-defined]
            code, store_history=False, user_expressions={"r": expr}, timeout=None
        )
        content = reply["content"]
        if content.get("status") != "ok":
            raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")
        result = content["user_expressions"]["r"]
        if result.get("status") != "ok":
            raise RuntimeError(f"{result.get('ename')}: {result.get('evalue')}")
        return json.loads(ast.literal_eval(result["data"]["text/plain"]))

    async def _snapshot(self, cells_done: int) -> None:
        path = str(self.jd.namespace_path)
        code = (
            "from gpuslice.checkpoint.namespace import snapshot_kernel as __gpuslice_snap\n"
            f"__gpuslice_r = __gpuslice_snap({path!r})"
        )
        try:
            report = await self._eval(code, "__gpuslice_r")
        except RuntimeError as e:
            # e.g. disk full: the previous good snapshot and its metadata stay as they were
            self.jd.log(f"namespace snapshot failed, keeping the previous one: {e}")
            return
        write_json_atomic(self.jd.namespace_meta_path, {"cells_done": cells_done, **report})
        self.last_snapshot = time.time()
        self.snapshot_cells = cells_done
        self.jd.write_state(last_checkpoint_at=self.last_snapshot)
        msg = f"namespace snapshot after cell {cells_done}: {report['bytes']} bytes"
        self.jd.log(f"{msg} in {report['seconds']}s")
        for name, why in report["skipped"].items():
            self.jd.log(f"  not saved: {name} ({why})")

    async def _restore(self) -> int:
        try:
            meta = json.loads(self.jd.namespace_meta_path.read_text())
        except (OSError, ValueError):
            return 0
        code = (
            "from gpuslice.checkpoint.namespace import restore_kernel as __gpuslice_rest\n"
            f"__gpuslice_r = __gpuslice_rest({str(self.jd.namespace_path)!r})"
        )
        report = await self._eval(code, "__gpuslice_r")
        for name, why in report["failed"].items():
            self.jd.log(f"  not restored: {name} ({why})")
        self.last_snapshot = time.time()
        return int(meta["cells_done"])

    # -- main loop ------------------------------------------------------------------------

    def _lost_work(self, now: float) -> float:
        safe = max(self.last_snapshot, self.jd.last_save_time(), self.started)
        return round(max(0.0, now - safe), 3)

    async def run(self) -> int:
        self.started = time.time()
        self.jd.checkpoints.mkdir(parents=True, exist_ok=True)
        nb, resuming = self._notebook()
        self.is_python = self._is_python(nb)
        attempt = self.attempt = int(self.jd.state().get("attempt", 0)) + 1
        code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        # Our own handlers from the start, before the state says "running" (the moment the
        # service may signal a preemption: one that came before them killed the runner
        # outright, work and checkpoint lost). nbclient's setup_kernel would install one
        # that shuts the kernel down on SIGTERM, so the kernel is managed here instead.
        loop = asyncio.get_running_loop()
        for sig in PREEMPT_SIGNALS:
            loop.add_signal_handler(sig, self._on_preempt, sig)
        self.jd.write_state(
            status="running",
            attempt=attempt,
            cells_total=len(code_cells),
            pid=os.getpid(),
            # which start of the job this is, as the service named it
            attempt_id=os.environ.get("GPUSLICE_ATTEMPT_ID"),
        )
        # The log and the counts number the code cells as they run, the cell gpuslice
        # inserts with the parameters included: say which one that is, so "cell 3" can be
        # found in the notebook as submitted.
        injected = [n for n, i in enumerate(code_cells) if is_injected(nb.cells[i])]
        what = f"{len(code_cells)} code cells" + (
            f" (cell {injected[0] + 1} sets the parameters given at submission)" if injected else ""
        )
        self.jd.log(f"attempt {attempt}: {what}, pid {os.getpid()}")
        os.environ.update(
            GPUSLICE_JOB_DIR=str(self.jd.root),
            GPUSLICE_CHECKPOINT_INTERVAL=str(self.interval),
            GPUSLICE_PARAMETERS=json.dumps(self.spec.get("parameters") or {}),
        )
        workdir = self._workdir()
        kernel_name = nb.metadata.get("kernelspec", {}).get("name") or "python3"
        self.client = _LiveOutputClient(
            nb,
            kernel_name=kernel_name,
            timeout=None,
            resources={"metadata": {"path": workdir}},
        )
        self.client.on_stream = self._log_output
        km = self.client.km = self.client.create_kernel_manager()
        # The kernel's connection file (its ports and signing key) in the job's runtime
        # folder (JUPYTER_RUNTIME_DIR, inside the job folder): a kernel manager of its own
        # writes it to the system's temporary folder otherwise, where it outlived a
        # cancelled job (issue 45). Removed with the kernel, or with the job folder.
        runtime = jupyter_runtime_dir()
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        km.connection_file = os.path.join(runtime, f"kernel-{uuid.uuid4().hex}.json")
        try:
            await self.client.async_start_new_kernel(cwd=workdir)
            await self.client.async_start_new_kernel_client()
            self.jd.write_state(kernel_pid=self._kernel_pid())
            self.usage.start(self._kernel_pid())
            start = 0
            if self.is_python:
                await self._eval(SETUP + "\n__gpuslice_r = '0'", "__gpuslice_r")
                self.kernel_ready = True
                if self.preempt_at is not None:
                    self._forward()
                if resuming:
                    start = await self._restore()
                    self.jd.log(
                        f"resumed from the namespace snapshot after cell {start}"
                        if start
                        else "no namespace snapshot was taken: running from the first cell"
                    )
            elif resuming:
                self.jd.log("not a Python kernel: rerunning from the top")
            return await self._cells(nb, code_cells, start)
        finally:
            await self.usage.stop()
            if self.client.kc is not None:
                self.client.kc.stop_channels()
            with contextlib.suppress(Exception):
                await ensure_async(km.shutdown_kernel(now=True))

    async def _cells(self, nb: nbformat.NotebookNode, code_cells: list[int], start: int) -> int:
        assert self.client is not None
        for n in range(start, len(code_cells)):
            if self.preempt_at is not None:
                return await self._preempted(n, at_boundary=True)
            index = code_cells[n]
            self.current_cell = n
            self.jd.write_state(current_cell=n)
            if self.is_python:
                # names the cell's default checkpoint, and clears "Preempted was raised"
                # (imported again: a cell may have cleared the namespace with %reset)
                await self._eval(
                    "import gpuslice.checkpoint as __gpuslice_ckpt\n"
                    f"__gpuslice_ckpt.begin_cell({n})\n__gpuslice_r = '0'",
                    "__gpuslice_r",
                )
            try:
                await self.client.async_execute_cell(nb.cells[index], index)
            except DeadKernelError:
                self._write_output(nb)
                if self.preempt_at is not None:  # killed along with us by the backend
                    return await self._preempted(n, at_boundary=False)
                self.jd.log(f"the kernel died in cell {n + 1}")
                self.jd.write_state(status="failed", error=f"cell {n + 1}: the kernel died")
                return EXIT_FAILED
            except CellExecutionError as e:
                self._write_output(nb)
                if e.ename == "Preempted":
                    return await self._preempted(n, at_boundary=False)
                if await self._swallowed_preemption(n):
                    return await self._preempted(n, at_boundary=False)
                self.jd.log(f"cell {n + 1} failed: {e.ename}: {e.evalue}")
                self.jd.write_state(status="failed", error=f"cell {n + 1}: {e.ename}: {e.evalue}")
                return EXIT_FAILED
            self._write_output(nb)
            if await self._swallowed_preemption(n):
                return await self._preempted(n, at_boundary=False)
            self.jd.write_state(cells_done=n + 1)
            due = time.time() - max(self.last_snapshot, self.started) >= self.interval
            if self.is_python and (due or self.preempt_at is not None) and n + 1 < len(code_cells):
                await self._snapshot(n + 1)
        self._export_html(nb)
        self.jd.write_state(status="completed", cells_done=len(code_cells), current_cell=None)
        self.jd.log("completed")
        return 0

    async def _swallowed_preemption(self, n: int) -> bool:
        """Whether cell *n* ended (normally, or with another error) after a checkpoint
        loop in it raised ``Preempted``: a bare ``except:`` caught it, and the loop did not
        finish. The cell must be resumed, not counted as done."""
        if self.preempt_at is None or not self.is_python:
            return False
        try:
            raised = await self._eval(
                "import gpuslice.checkpoint as __gpuslice_ckpt\n"
                "__gpuslice_r = str(int(__gpuslice_ckpt.raised_in_cell()))",
                "__gpuslice_r",
            )
        except RuntimeError:
            return False
        if raised:
            self.jd.log(
                f"warning: cell {n + 1} caught gpuslice's Preempted (a bare except: or "
                "except BaseException:); its loop stopped early, so the cell is resumed "
                "rather than counted as done"
            )
        return bool(raised)

    async def _preempted(self, n: int, at_boundary: bool) -> int:
        now = time.time()
        if at_boundary and self.is_python and self.snapshot_cells != n:
            # (the cell loop may have just taken this very snapshot, seeing the signal)
            await self._snapshot(n)
        lost = self._lost_work(now)
        where = f"before cell {n + 1}" if at_boundary else f"in cell {n + 1}"
        self.jd.log(f"preempted {where}; about {lost:.1f}s of work to redo")
        # which run was preempted: the next run overwrites the status at once, and the
        # service, which may see the engine's requeue only after that, tells from this
        # that the run it watched checkpointed (a Slurm job restarts within seconds)
        self.jd.write_state(
            status="preempted",
            lost_work_seconds=lost,
            current_cell=None,
            preempted_attempt=self.attempt,
        )
        return EXIT_PREEMPTED

    def _export_html(self, nb: nbformat.NotebookNode) -> None:
        try:
            from nbconvert import HTMLExporter
        except ImportError:
            self.jd.log("nbconvert is not installed: no HTML output")
            return
        try:
            body, _ = HTMLExporter().from_notebook_node(nb)
            self.jd.html_path.write_text(body)
        except Exception as e:  # the notebook ran; a failed export must not fail the job
            self.jd.log(f"HTML export failed: {e}")


async def run_job(job_dir: Path, usage_interval: float | None = None) -> int:
    return await Runner(job_dir, usage_interval).run()
