"""The floors of the package are its folders, read from its imports (ast, nothing is imported).

Data flows downward only, one floor per folder: core, ops < parallel, cli < model < data <
config < evaluation < training < hf < inference < analysis < compile < the commands (the
modules at the package's top level, and pods/). A module may import its own floor or lower
ones, never a higher one, and no chain of imports may come back to where it started. Every
import counts: inside functions as much as at the top of a file, and under `if
TYPE_CHECKING:` too (an annotation that names a module above is an arrow up all the same).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "gated_attention"

# Floor of every folder of the package. A module at the top level is a command; a new
# folder must be placed here: one with no floor fails the test rather than slipping in.
FLOOR_NAMES = ("core", "parallel", "model", "data", "config", "evaluation", "training", "hf",
               "inference", "analysis", "compile", "commands")
FOLDER_FLOORS: dict[str, int] = {
    "core": 0,  # the user-error class, field checks, paths: imports nothing of the package
    "ops": 0,  # kernels, plain functions of arrays (no Flax, no configs)
    "parallel": 1,  # meshes, logical-axis rules, processes
    "cli": 1,  # the commands' flags, the training argv, the platform choice
    "model": 2,  # variants, the model description, layers, the transformer
    "data": 3,
    "config": 4,  # the run config: schema, archs, recipes, each section's checks
    "evaluation": 5,  # lm-eval's backend; the training loop runs its hook
    "training": 6,
    "hf": 7,  # Hugging Face checkpoints in and out (a run's files)
    "inference": 8,  # generation, loading a run or a Hugging Face folder
    "analysis": 9,  # analysis of trained runs
    "compile": 10,  # compiling for targets that are not attached, the pre-flight
    "pods": 11,  # commands the pod scripts run
}
COMMANDS = 11
FLOORS = {f"gated_attention.{folder}": floor for folder, floor in FOLDER_FLOORS.items()}


def test_the_top_level_holds_commands_only():
    """Every module at the package's top level is a command a user runs (`python -m`)."""
    main_block = 'if __name__ == "__main__":'
    not_commands = [p.name for p in PACKAGE.glob("*.py")
                    if p.name != "__init__.py" and main_block not in p.read_text()]
    assert not not_commands, f"move these into a folder by role: {not_commands}"
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(FOLDER_FLOORS), f"floors to place: {folders ^ set(FOLDER_FLOORS)}"


# (importer, imported) -> why the arrow is tolerated. Keep this short.
EXCEPTIONS: dict[tuple[str, str], str] = {}
# Third-party packages the kernels' floor must not import.
OPS_FORBIDDEN = ("flax", "ml_collections", "absl")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: Iterable[str]) -> tuple[set[str], set[str]]:
    """(project modules, third-party top-level packages) imported anywhere in the file."""
    modules = set(modules)
    project: set[str] = set()
    external: set[str] = set()
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != "gated_attention":
                external.add(target.split(".")[0])
                continue
            while target not in modules and "." in target:  # `import pkg.mod.attr` forms
                target = target.rsplit(".", 1)[0]
            if target != name and target != "gated_attention":
                project.add(target)
    return project, external


def floor_of(module: str) -> int | None:
    """The module's folder's floor; COMMANDS for a module at the top level."""
    parts = module.split(".")
    if len(parts) == 2 and parts[1] not in FOLDER_FLOORS:
        return COMMANDS
    return FLOORS.get(".".join(parts[:2]))


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = package_modules()
    graph, external = {}, {}
    for name, path in modules.items():
        graph[name], external[name] = imports_of(name, path, modules)
    return graph, external


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_reader_sees_lazy_and_relative_imports(tmp_path):
    source = ("import json\nfrom gated_attention.parallel import sharding\n"
              "def f():\n    from gated_attention.ops import gating\n    from . import paths\n")
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {"gated_attention.x.mod", "gated_attention.parallel.sharding", "gated_attention.ops",
               "gated_attention.ops.gating", "gated_attention.x.paths"}
    project, external = imports_of("gated_attention.x.mod", path, modules)
    assert project == {"gated_attention.parallel.sharding", "gated_attention.ops.gating",
                       "gated_attention.x.paths"}
    assert external == {"json"}


# A module that imports the run config for type hints only.
TYPE_ONLY_IMPORT = ("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n"
                    "    from gated_attention.config.run_config import ModelConfig\n")


def test_import_reader_counts_type_only_imports(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(TYPE_ONLY_IMPORT)
    modules = {"gated_attention.x.mod", "gated_attention.config.run_config"}
    project, _ = imports_of("gated_attention.x.mod", path, modules)
    assert project == {"gated_attention.config.run_config"}


def test_an_upward_import_fails_the_floor_check(tmp_path):
    """Negative control: a layer naming the run config (even for a type only) is caught."""
    path = tmp_path / "attention.py"
    path.write_text(TYPE_ONLY_IMPORT)
    name = "gated_attention.model.layers.attention"
    project, _ = imports_of(name, path, set(package_modules()))
    assert upward_arrows({name: project}) == [
        "gated_attention.model.layers.attention (model) -> gated_attention.config.run_config "
        "(config)"]


def test_every_module_has_a_floor():
    missing = [m for m in package_modules() if m != "gated_attention" and floor_of(m) is None]
    assert not missing, f"place these modules on a floor in FLOORS: {missing}"


def test_no_import_cycles():
    graph, _ = import_graph()
    allowed = {(a, b) for a, b in EXCEPTIONS}
    pruned = {a: {b for b in deps if (a, b) not in allowed} for a, deps in graph.items()}
    cycles = find_cycles(pruned)
    assert not cycles, "import cycles (lazy imports included): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def upward_arrows(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import from a lower floor to a higher one, as "importer (floor) -> dep (floor)"."""
    upward = []
    for importer, deps in sorted(graph.items()):
        low = floor_of(importer)
        for dep in sorted(deps):
            high = floor_of(dep)
            if (low is not None and high is not None and high > low
                    and (importer, dep) not in EXCEPTIONS):
                upward.append(f"{importer} ({FLOOR_NAMES[low]}) -> {dep} ({FLOOR_NAMES[high]})")
    return upward


def test_no_arrow_from_a_lower_floor_to_a_higher_one():
    graph, _ = import_graph()
    upward = upward_arrows(graph)
    assert not upward, "imports that go up a floor:\n" + "\n".join(upward)


def test_the_model_reads_its_config_from_its_own_floor():
    """The layers and the model import ModelConfig at run time from model_config.py."""
    graph, _ = import_graph()
    for module in ("gated_attention.model.layers.attention", "gated_attention.model.layers.block",
                   "gated_attention.model.layers.moe", "gated_attention.model.transformer"):
        assert "gated_attention.model.model_config" in graph[module], module
        assert "gated_attention.config.run_config" not in graph[module], module


def test_kernels_know_no_flax_and_no_configs():
    _, external = import_graph()
    bad = [f"{m} imports {pkg}" for m, pkgs in sorted(external.items())
           if floor_of(m) == 0 for pkg in sorted(pkgs) if pkg in OPS_FORBIDDEN]
    assert not bad, "\n".join(bad)


def test_the_data_sources_import_nothing_from_analysis():
    """Training data never depend on the analysis of runs (passkey's generator is in data/)."""
    graph, _ = import_graph()
    bad = [f"{m} -> {d}" for m, deps in sorted(graph.items())
           if m.startswith("gated_attention.data") for d in sorted(deps)
           if d.startswith("gated_attention.analysis")]
    assert not bad, "\n".join(bad)
