"""The service's HTML pages as Jinja templates a site can override.

A folder in ``GPUSliceService.template_paths`` that holds a file named like one of ours
(``page.html``, ``overview.html``, ``admin.html``, ``forbidden.html``) replaces it; an override
can extend the original as ``gpuslice/<name>``, so a site banner is a three-line file::

    {% extends "gpuslice/page.html" %}
    {% block announcement %}<p class="banner">Maintenance on Friday</p>{% endblock %}
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import jinja2

from .errors import ConfigError

BUILTIN = Path(__file__).resolve().parent / "templates"
PAGES = ("page.html", "overview.html", "admin.html", "forbidden.html")


def page_environment(template_paths: Sequence[str] = ()) -> jinja2.Environment:
    """Templates from ``template_paths`` first, then ours; ours also as ``gpuslice/…``."""
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.FileSystemLoader([*template_paths, str(BUILTIN)]),
                jinja2.PrefixLoader({"gpuslice": jinja2.FileSystemLoader(str(BUILTIN))}),
            ]
        ),
        # every value a page shows comes from users or admins: escape all of it
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


def check_template_paths(template_paths: Sequence[str]) -> jinja2.Environment:
    """The environment, once every folder exists and overrides something, and every page
    compiles: a broken override is refused at start, not shown as a 500 to a researcher."""
    for folder in template_paths:
        path = Path(folder)
        if not path.is_dir():
            raise ConfigError("template_paths", f"{folder} is not a folder")
        if not any((path / name).is_file() for name in PAGES):
            raise ConfigError(
                "template_paths",
                f"{folder} holds none of the service's templates ({', '.join(PAGES)}), "
                "so it would change nothing",
            )
    env = page_environment(template_paths)
    for name in PAGES:
        try:
            env.get_template(name)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError("template_paths", f"{e.filename}:{e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:  # e.g. an {% extends %} of a missing template
            raise ConfigError("template_paths", f"{name}: {e}") from None
    return env
