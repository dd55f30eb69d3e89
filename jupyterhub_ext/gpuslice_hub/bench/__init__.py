"""The openb trace benchmark (``gpuslice-bench openb``) over the placement engine."""
