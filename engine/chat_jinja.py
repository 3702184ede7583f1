"""The sandbox chat templates render in, the way `transformers` renders them (trim_blocks, lstrip_blocks, `tojson`,
`raise_exception`, `strftime_now`). A module of its own, so that rendering a template (what a model's template can
do, adapters/chat_template.py) loads neither `tokenizers` (2.4 s to import here) nor torch."""
from __future__ import annotations

import json
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def chat_template_env() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
