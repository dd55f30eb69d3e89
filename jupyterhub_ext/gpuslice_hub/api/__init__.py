"""REST handlers of the gpuslice service."""
