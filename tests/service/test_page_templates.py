"""The service's pages are Jinja templates a site can override (GPUSliceService.
template_paths): an override replaces or extends ours, everything shown is escaped, and a
folder that would change nothing or a broken template is refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice_hub.errors import ConfigError
from gpuslice_hub.templating import PAGES, check_template_paths, page_environment

VALUES = {
    "static_url": lambda name: f"/static/{name}",
    "prefix": "/services/gpuslice/",
    "hub_prefix": "/hub/",
    "user": "ann<script>",
    "is_admin": False,
    "backend": "nvml",
    "simulated": False,
    "quota": [{"scope": "group", "name": "<ml>", "text": "1 of 2 slices"}],
    "profiles": [
        {
            "display_name": "MIG <1g>",
            "description": "d",
            "free": 3,
            "total": 7,
            "available": True,
            "reason": "",
        }
    ],
    "allocations": [],
    "admin_scope": "custom:gpuslice:admin",
    "xsrf_token": "t",
}


def test_every_built_in_page_renders_and_escapes_what_it_shows():
    env = page_environment()
    for name in PAGES:
        html = env.get_template(name).render(**VALUES)
        assert html.startswith("<!doctype html>") or "<!doctype html>" in html[:400], name
        assert "<script>" not in html.replace('<script src="/static/admin.js">', ""), name
    overview = env.get_template("overview.html").render(**VALUES)
    assert "ann&lt;script&gt;" in overview and "Group <b>&lt;ml&gt;</b>" in overview
    assert "MIG &lt;1g&gt;" in overview and "3 of 7" in overview


def test_an_override_replaces_or_extends_the_built_in_template(tmp_path: Path):
    (tmp_path / "overview.html").write_text("mine: {{ user }}")
    (tmp_path / "page.html").write_text(
        '{% extends "gpuslice/page.html" %}{% block announcement %}<p id="b">hi</p>{% endblock %}'
    )
    env = check_template_paths([str(tmp_path)])
    assert env.get_template("overview.html").render(**VALUES) == "mine: ann&lt;script&gt;"
    admin = env.get_template("admin.html").render(**VALUES)  # ours, on the site's layout
    assert '<p id="b">hi</p>' in admin and 'name="gpuslice-api"' in admin


def test_a_missing_folder_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        check_template_paths([str(tmp_path / "nope")])
    assert info.value.key == "template_paths" and "is not a folder" in str(info.value)


def test_a_folder_that_overrides_nothing_is_refused(tmp_path: Path):
    (tmp_path / "home.html").write_text("JupyterHub's, not ours")
    with pytest.raises(ConfigError) as info:
        check_template_paths([str(tmp_path)])
    assert "would change nothing" in str(info.value)


def test_a_broken_override_is_refused_at_start_with_its_file_and_line(tmp_path: Path):
    (tmp_path / "admin.html").write_text("<p>\n{% if user %}unclosed\n")
    with pytest.raises(ConfigError) as info:
        check_template_paths([str(tmp_path)])
    assert info.value.key == "template_paths"
    assert "admin.html" in str(info.value)
