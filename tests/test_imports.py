"""Every relative import in app/ (including the lazy ones inside functions, which only run on
the GPU or in a rare branch) names a module that exists, so a wrong number of dots cannot hide
until a GPU run."""
import ast
import importlib.util
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"
SOURCES = sorted(APP.rglob("*.py"))


def _module_name(path):
    parts = list(path.relative_to(APP).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["hisparse"] + parts), path.name == "__init__.py"


def _relative_imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            yield node


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(APP)) for p in SOURCES])
def test_relative_imports_resolve(path):
    module, is_package = _module_name(path)
    package = module if is_package else module.rpartition(".")[0]
    for node in _relative_imports(path):
        base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        if node.module is None:  # from . import name: each name is a module of the package
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            targets = [base]
        for target in targets:
            assert importlib.util.find_spec(target) is not None, \
                f"{path.relative_to(APP)}:{node.lineno}: no module {target}"
