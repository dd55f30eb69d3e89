"""``python -m gpuslice.run JOB_DIR``: run a gpuslice batch job's notebook.

Exit status: 0 completed, 1 a cell failed, 75 preempted (requeue me), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import traceback
from pathlib import Path

from .jobdir import EXIT_FAILED, JobDir
from .runner import run_job
from .usage import DEFAULT_USAGE_INTERVAL, USAGE_INTERVAL_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuslice.run", description=__doc__)
    parser.add_argument("job_dir", type=Path, help="the job folder (with job.json)")
    parser.add_argument(
        "--usage-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="write the kernel's mean GPU utilization and peak memory into state.json at "
        f"most this often; 0: never (default: ${USAGE_INTERVAL_ENV}, else "
        f"{DEFAULT_USAGE_INTERVAL:g})",
    )
    args = parser.parse_args(argv)
    if args.usage_interval is not None and args.usage_interval < 0:
        parser.error("--usage-interval must be >= 0")
    jd = JobDir(args.job_dir.resolve())
    if not jd.spec_path.exists():
        parser.error(f"{jd.spec_path} does not exist")
    try:
        return asyncio.run(run_job(jd.root, args.usage_interval))
    except Exception as e:
        jd.log(f"runner error: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        jd.write_state(status="failed", error=f"runner error: {type(e).__name__}: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
