"""The job folder: the contract between the service, its backends and the runner.

``job.json`` (written by the service: the notebook, parameters, checkpoint interval) is
read-only for the runner; ``state.json`` (written by the runner, atomically) tells the
service how far the job got, without the runner needing any credentials.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The runner's exit status when it stopped because it was preempted (EX_TEMPFAIL).
EXIT_PREEMPTED = 75
EXIT_FAILED = 1


@dataclass(frozen=True)
class JobDir:
    root: Path

    @property
    def spec_path(self) -> Path:
        return self.root / "job.json"

    @property
    def input_path(self) -> Path:
        return self.root / "input.ipynb"

    @property
    def output_path(self) -> Path:
        return self.root / "output.ipynb"

    @property
    def html_path(self) -> Path:
        return self.root / "output.html"

    @property
    def log_path(self) -> Path:
        return self.root / "job.log"

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def namespace_path(self) -> Path:
        return self.checkpoints / "namespace.ckpt"

    @property
    def namespace_meta_path(self) -> Path:
        return self.checkpoints / "namespace.json"

    @property
    def last_save_marker(self) -> Path:
        return self.checkpoints / ".last-save"

    def spec(self) -> dict[str, Any]:
        return json.loads(self.spec_path.read_text())

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def write_state(self, **fields: Any) -> dict[str, Any]:
        state = {**self.state(), **fields, "updated_at": time.time()}
        write_json_atomic(self.state_path, state)
        return state

    def log(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(self.log_path, "a") as f:
            f.write(f"[{stamp}] {message}\n")

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def last_save_time(self) -> float:
        try:
            return float(self.last_save_marker.read_text())
        except (OSError, ValueError):
            return 0.0


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
