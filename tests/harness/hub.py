"""Fixture: a real JupyterHub with the gpuslice service, on random ports."""
