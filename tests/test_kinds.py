"""tests/kinds.py: the registry of reference kinds names real tests and real kinds."""

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
