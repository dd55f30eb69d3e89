"""pytest-jupyter for the server-extension tests only.

Its plugin modules also bring autouse fixtures and hooks that run every coroutine test on
their own event loop, which would fight pytest-asyncio across the rest of the suite (see
DESIGN.md). So only their *fixtures* are imported here, for this folder, and the tests
are plain functions that drive ``jp_asyncio_loop`` themselves.
"""

from __future__ import annotations

import pytest_jupyter.jupyter_core as _core
import pytest_jupyter.jupyter_server as _server
import pytest_jupyter.pytest_tornasync as _tornasync
from _pytest.fixtures import FixtureFunctionDefinition

for _module in (_core, _tornasync, _server):
    for _name, _value in vars(_module).items():
        if isinstance(_value, FixtureFunctionDefinition):
            globals()[_name] = _value
