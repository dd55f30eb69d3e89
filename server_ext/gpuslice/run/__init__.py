"""The batch runner, ``python -m gpuslice.run JOB_DIR`` (see :mod:`gpuslice.run.runner`)."""
