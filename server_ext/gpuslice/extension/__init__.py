"""The ``gpuslice`` Jupyter server extension: GPU activity per kernel, the idle policy,
warnings, keep-alive, memory caps and reporting to the gpuslice service.

Importing this package imports nothing from jupyter_server, so the hub service can use the
pure policy model (:mod:`.policy`) without pulling in a notebook server.
"""
