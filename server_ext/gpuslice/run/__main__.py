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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuslice.run", description=__doc__)
    parser.add_argument("job_dir", type=Path, help="the job folder (with job.json)")
    args = parser.parse_args(argv)
    jd = JobDir(args.job_dir.resolve())
    if not jd.spec_path.exists():
        parser.error(f"{jd.spec_path} does not exist")
    try:
        return asyncio.run(run_job(jd.root))
    except Exception as e:
        jd.log(f"runner error: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        jd.write_state(status="failed", error=f"runner error: {type(e).__name__}: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
