"""The sandbox chat templates render in, the way `transformers` renders them (trim_blocks, lstrip_blocks, `tojson`,
`raise_exception`, `strftime_now`, `{% generation %}`). A module of its own, so that rendering a template (what a
model's template can do, adapters/chat_template.py) loads neither `tokenizers` (2.4 s to import here) nor torch."""
from __future__ import annotations

import json
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`, which transformers' templates mark the assistant's text with (for
    its training masks): the body as it is. Without it LFM2's and Laguna's templates did not parse."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def chat_template_env() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _Generation])

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
