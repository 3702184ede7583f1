"""config.example.toml is rendered from the config classes: every key documented, every default the schema's."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from proxy import config_example
from proxy.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [cls for cls in (config_example.Config, *config_example._TABLES.values(), config_example.BackendConfig,
                           config_example.RouteConfig, config_example.RoutePolicy, config_example.SpeculativeConfig,
                           *config_example._KIND_OPTIONS)]


def test_example_file_is_the_rendered_schema():
    """Fails when a key, a doc or a default changes without `python -m proxy.config_example > config.example.toml`."""
    assert (ROOT / "config.example.toml").read_text() == config_example.render()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_key_is_documented_with_its_default(cls):
    """Tables ([server], [[backends]], ...) are documented by their class docstring, keys by their field doc."""
    text, hints = config_example.render(), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        table = [t for t in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(t)]
        if table:
            assert table[0].__doc__ and " ".join(table[0].__doc__.split()[:4]) in " ".join(text.split())
            continue
        assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"
        assert f"{f.name}: {f.metadata['doc'].split()[0]}" in text, f"{cls.__name__}.{f.name} not rendered"


def test_rendered_example_loads():
    cfg = load_config(ROOT / "config.example.toml")
    assert cfg.server.port == 8000 and len(cfg.backends) == 5 and cfg.backends[4].model.endswith(".gguf")
