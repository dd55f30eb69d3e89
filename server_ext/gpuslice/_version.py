"""The installed version. Its one source is ``labextension/package.json`` (see
``[tool.hatch.version]`` in pyproject.toml): Python and npm cannot disagree."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpuslice")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
