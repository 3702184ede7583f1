"""The dependency direction proxy -> adapters -> engine, checked by parsing every import."""
from __future__ import annotations

import ast
import subprocess
import sys
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


def _writes_to(tree: ast.AST, attr: str) -> list[int]:
    """Lines that assign to anything reached through `.attr` (x.attr = ..., x.attr.y = ..., x.attr.y += ...)."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            chain = target
            while isinstance(chain, (ast.Attribute, ast.Subscript)):
                if isinstance(chain, ast.Attribute) and chain.attr == attr:
                    lines.append(node.lineno)
                chain = chain.value
    return lines


def test_only_pipeline_stages_write_a_jobs_outcome_and_target():
    """The route reads a finished result; stages (proxy/stages/) are the only writers."""
    allowed = {ROOT / "proxy" / "job.py"}
    bad = {}
    for path in ROOT.glob("proxy/**/*.py"):
        if path in allowed or "stages" in path.relative_to(ROOT).parts:
            continue
        tree = ast.parse(path.read_text())
        if lines := _writes_to(tree, "outcome") + _writes_to(tree, "target"):
            bad[str(path.relative_to(ROOT))] = lines
    assert bad == {}


def test_engine_bookkeeping_loads_without_torch():
    """The scheduler, block manager, radix cache and sequence are plain Python: importing them must not pull in
    torch (2.8 s), so they stay testable and reusable without it."""
    modules = ["engine.scheduler", "engine.kv_cache", "engine.radix_cache", "engine.sequence"]
    code = f"import sys\nfor m in {modules}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_fim_table_loads_without_torch_or_tokenizers():
    """engine/fim.py is the one table of fill-in-the-middle markers; adapters/model_card.py reads it for /api/show
    of llama-server models, which must not load the tokenizer library (engine/tokenizer.py) or torch to say it."""
    code = "import sys, engine.fim, adapters.model_card\nprint(sorted({'torch', 'tokenizers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
