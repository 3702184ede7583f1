"""The dependency direction proxy -> adapters -> engine, checked by parsing every import."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"engine": {"proxy", "adapters", "aiohttp"}, "adapters": {"proxy"}}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_never_imports_upwards(package):
    bad = {str(p.relative_to(ROOT)): _imports(p) & FORBIDDEN[package] for p in (ROOT / package).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}
