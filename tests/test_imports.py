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


def _exported_names(package):
    """The names in ``package``'s ``__all__`` (the lazy packages, hisparse.gpu and
    hisparse.parallel, import no CUDA or MPI to list them)."""
    return set(getattr(importlib.import_module(package), "__all__", ()))


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(APP)) for p in SOURCES])
def test_relative_imports_resolve(path):
    module, is_package = _module_name(path)
    package = module if is_package else module.rpartition(".")[0]
    for node in _relative_imports(path):
        base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        if node.module is None:  # from . import name: a module of the package, or a name it exports
            targets = [f"{base}.{alias.name}" for alias in node.names
                       if alias.name not in _exported_names(base)]
        else:
            targets = [base]
        for target in targets:
            assert importlib.util.find_spec(target) is not None, \
                f"{path.relative_to(APP)}:{node.lineno}: no module {target}"


def _private_target(node, package):
    """The private module an import names, or None: ``pkg._module`` (a leading underscore on
    the module's last component), resolved from a relative import in ``package``."""
    if not node.module:
        return None
    target = importlib.util.resolve_name("." * node.level + node.module, package)
    parent, _, leaf = target.rpartition(".")
    return (target, parent) if leaf.startswith("_") and not leaf.startswith("__") else None


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(APP)) for p in SOURCES])
def test_no_import_reaches_into_another_packages_private_module(path):
    """A package's ``__init__`` is its contract: a private module (``_name.py``) is imported only
    by the modules of its own package, everything else goes through what the package exports
    (so moving code inside a package never breaks another)."""
    module, is_package = _module_name(path)
    package = module if is_package else module.rpartition(".")[0]
    for node in _relative_imports(path):
        private = _private_target(node, package)
        if private:
            target, parent = private
            assert parent == package, (
                f"{path.relative_to(APP)}:{node.lineno}: imports {target}, a private module of "
                f"{parent}; import the name from {parent} (add it to its exports) instead")


def test_the_private_import_check_catches_a_reach_into_another_package(tmp_path):
    """The check above fails on the kind of import it exists for (and passes a sibling's)."""
    source = "from ..formats._csr5 import build_csr5\nfrom ._sibling import name\n"
    nodes = list(ast.walk(ast.parse(source)))
    imports = [n for n in nodes if isinstance(n, ast.ImportFrom)]
    assert _private_target(imports[0], "hisparse.ops") == ("hisparse.formats._csr5",
                                                           "hisparse.formats")
    assert _private_target(imports[1], "hisparse.ops")[1] == "hisparse.ops"


def test_every_name_a_package_exports_resolves():
    """Each name listed in a package's ``__all__`` is importable from it (the lazy tables of
    hisparse.gpu and hisparse.parallel included)."""
    for init in sorted(APP.rglob("__init__.py")):
        module, _ = _module_name(init)
        if module.startswith("hisparse.ops."):
            continue  # the operations: imported by the registry test below
        package = importlib.import_module(module)
        for name in getattr(package, "__all__", ()):
            if module == "hisparse.gpu" or module == "hisparse.parallel":
                # resolved lazily: check the module that holds it defines it, without importing CUDA
                where = importlib.util.resolve_name(package._WHERE[name], module)
                assert name in (APP / Path(*where.split(".")[1:])).with_suffix(".py").read_text(), \
                    f"{module}.{name}: not defined in {where}"
            else:
                assert hasattr(package, name), f"{module} exports {name} but has no such name"


@pytest.mark.parametrize("name", ["spmv", "spgemm", "sptv", "cpals", "cholesky"])
def test_each_operation_declares_what_its_collect_does(name):
    """The driver reads an operation's capabilities from its declarations (GATHERS_RESULT,
    WRITES_PARTS), not from which methods it overrides: each declaration matches the code."""
    from hisparse.ops import Operation, get_operation_class
    op = get_operation_class(name)
    assert op.GATHERS_RESULT == (op.collect is not Operation.collect), name
    assert op.WRITES_PARTS == (op.local_result_arrays is not Operation.local_result_arrays), name
    assert op.writes_parts() == op.WRITES_PARTS
