"""pytest-jupyter for the server-extension tests only.

Its plugin modules also bring autouse fixtures and hooks that run every coroutine test on
their own event loop, which would fight pytest-asyncio across the rest of the suite. So
only their *fixtures* are imported here, for this folder, and the tests are plain
functions that drive ``jp_asyncio_loop`` themselves.
"""

from __future__ import annotations

# Imported by name (pytest_jupyter's documented fixtures, with those they depend on): a
# conftest offers the fixtures among its globals, and none of the plugin's hooks.
from pytest_jupyter.jupyter_server import (  # noqa: F401
    echo_kernel_spec,
    http_server,
    http_server_client,
    http_server_port,
    io_loop,
    jp_argv,
    jp_asyncio_loop,
    jp_auth_header,
    jp_base_url,
    jp_config_dir,
    jp_configurable_serverapp,
    jp_create_notebook,
    jp_data_dir,
    jp_env_config_path,
    jp_env_jupyter_path,
    jp_environ,
    jp_extension_environ,
    jp_fetch,
    jp_home_dir,
    jp_http_port,
    jp_kernel_dir,
    jp_logging_stream,
    jp_nbconvert_templates,
    jp_root_dir,
    jp_runtime_dir,
    jp_server_auth_core_resources,
    jp_server_auth_resources,
    jp_server_authorizer,
    jp_server_cleanup,
    jp_server_config,
    jp_serverapp,
    jp_system_config_path,
    jp_system_jupyter_path,
    jp_template_dir,
    jp_web_app,
    jp_ws_fetch,
    send_request,
)
