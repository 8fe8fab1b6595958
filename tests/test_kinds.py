"""tests/kinds.py: the registry of reference kinds names real tests and real kinds, and every
test of the suite has a kind; optional packages are asked for by marks, not module skips."""

import ast
from pathlib import Path

import kinds
import pytest

pytestmark = pytest.mark.reference("golden")
HERE = Path(__file__).parent


def test_registry_names_existing_files_functions_and_kinds():
    stale = []
    for module, (default, overrides) in kinds.REGISTRY.items():
        path = HERE / f"{module}.py"
        assert path.exists(), f"{module}.py is in the registry but not in tests/"
        functions = {node.name for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
        stale += [f"{module}::{name}" for name in overrides if name not in functions]
        assert {default, *overrides.values()} <= set(kinds.KINDS), module
    assert not stale, f"the registry names tests that do not exist: {stale}"


def test_a_marker_overrides_the_registry_and_unknown_kinds_are_refused():
    assert kinds.kind_of("test_variants", "test_registry_fields") == "golden"
    assert kinds.kind_of("test_variants", "test_gate_position_aliases", "independent") == \
        "independent"
    assert kinds.kind_of("test_not_registered", "test_x") == "unclassified"
    with pytest.raises(ValueError, match="reference\\('exact'\\) is not a kind; choose one of"):
        kinds.kind_of("test_variants", "test_registry_fields", "exact")


def reference_kind(node: ast.AST) -> str | None:
    """The kind in a `pytest.mark.reference("kind")` call anywhere inside `node`, if any."""
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "reference" and call.args
                and isinstance(call.args[0], ast.Constant)):
            return call.args[0].value
    return None


def collected_functions(tree: ast.Module):
    """The test functions pytest collects from a module: `test_*` at module level and in
    `Test*` classes."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from (f for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name.startswith("test_"))


def test_every_test_of_the_suite_has_a_kind():
    """A test file that is not in the registry and marks no kind fails here, as does a kind
    no one defined: `python tests/kinds.py` never counts an unclassified test."""
    unclassified = []
    for path in sorted(HERE.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_kind = next((reference_kind(node.value) for node in tree.body
                            if isinstance(node, ast.Assign)
                            and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                    for t in node.targets)), None)
        for function in collected_functions(tree):
            marked = next(filter(None, map(reference_kind, function.decorator_list)),
                          module_kind)
            kind = kinds.kind_of(path.stem, function.name, marked)
            if kind == kinds.UNCLASSIFIED:
                unclassified.append(f"{path.name}::{function.name}")
    assert not unclassified, (
        f"tests with no kind (add them to REGISTRY in tests/kinds.py or mark them "
        f"@pytest.mark.reference(kind)): {unclassified}")


def test_the_kind_check_sees_an_unregistered_file(tmp_path, monkeypatch):
    (tmp_path / "test_new.py").write_text("def test_a():\n    pass\n")
    monkeypatch.setitem(globals(), "HERE", tmp_path)
    with pytest.raises(AssertionError, match=r"tests with no kind .*test_new.py::test_a"):
        test_every_test_of_the_suite_has_a_kind()
    (tmp_path / "test_new.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.reference('smoke')\n\n"
        "def test_a():\n    pass\n")
    test_every_test_of_the_suite_has_a_kind()


def optional_skips(tree: ast.Module) -> list[int]:
    """Lines of `importorskip` calls, and of `pytest.skip` calls outside any function (a
    module-level skip): the one rule is `@pytest.mark.needs(package)` (tests/conftest.py)."""
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    inside = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    lines = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            if call.func.attr == "importorskip" or (
                    call.func.attr == "skip" and id(call) not in inside):
                lines.append(call.lineno)
    return lines


def test_optional_packages_are_asked_for_by_marks_never_by_module_skips():
    found = {path.name: lines for path in sorted(HERE.glob("*.py"))
             if (lines := optional_skips(ast.parse(path.read_text())))}
    assert not found, f"importorskip or a module-level skip (use @pytest.mark.needs): {found}"
    planted = ast.parse("import pytest\nx = pytest.importorskip('x')\n"
                        "pytest.skip('no', allow_module_level=True)\n"
                        "def test_a():\n    pytest.skip('fine: one test, its own reason')\n")
    assert optional_skips(planted) == [2, 3]
