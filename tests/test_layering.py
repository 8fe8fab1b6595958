"""The floors of the package, read from its imports (ast, nothing is imported).

Data flows downward only: ops < sharding < layers < model < train < CLIs. A module may import
its own floor or lower ones, never a higher one, and no chain of imports may come back to
where it started. Every import counts: inside functions as much as at the top of a file, and
under `if TYPE_CHECKING:` too (an annotation that names a module above is an arrow up all
the same; the model's config lives beside the model, in model_config.py, for that reason).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "gated_attention"

# Floor of every module, by dotted prefix (the longest prefix wins). A new module must be
# placed here: a file with no floor fails the test rather than slipping in unchecked.
FLOORS: dict[str, int] = {
    # 0: kernels, plain functions of arrays (no Flax, no configs).
    "gated_attention.ops": 0,
    "gated_attention.errors": 0,  # the one user-error class: every floor may raise it
    # 1: the ground floor: meshes and logical-axis rules, file paths, processes.
    "gated_attention.sharding": 1,
    "gated_attention.paths": 1,
    "gated_attention.distributed": 1,
    "gated_attention.tpu_topologies": 1,
    "gated_attention.gpu_targets": 1,
    "gated_attention.watchdog": 1,
    "gated_attention.cuda_compile": 1,
    "gated_attention.cpu_compile": 0,  # cheap CPU compiles (imports nothing), for ops.testing
    "gated_attention.config_checks": 1,
    "gated_attention.train_command": 1,  # the training command's argv (imports cli_flags only)
    "gated_attention.cli_flags": 1,  # every command's flags, parsed on their own FlagValues
    # 2: what the model is made of: the variant space, the model description, layers.
    "gated_attention.variants": 2,
    "gated_attention.layers": 2,
    "gated_attention.model_config": 2,
    # 3: the model, what it exposes, and the numbers read off it.
    "gated_attention.model": 3,
    "gated_attention.capture": 3,
    "gated_attention.losses": 3,
    "gated_attention.accounting": 3,
    # 4: training, its inputs and outputs, the run config, analysis of runs.
    "gated_attention.train": 4,
    "gated_attention.optim": 4,
    "gated_attention.train_config": 4,
    "gated_attention.checkpoint": 4,
    "gated_attention.metrics_writer": 4,
    "gated_attention.workdir": 4,
    "gated_attention.data": 4,
    "gated_attention.config_lib": 4,
    "gated_attention.memory": 4,
    "gated_attention.analysis": 4,
    "gated_attention.interrupts": 4,
    "gated_attention.workdir_lock": 4,
    "gated_attention.progress_log": 4,
    "gated_attention.init_from": 4,
    "gated_attention.run_checks": 4,
    "gated_attention.init_by_name": 3,
    "gated_attention.telemetry": 4,
    "gated_attention.run_record": 4,
    "gated_attention.telemetry_report": 4,
    "gated_attention.hf": 4,
    "gated_attention.evaluation": 4,  # lm-eval's backend: the training loop runs it too
    # 5: command lines.
    "gated_attention.main": 5,
    "gated_attention.inspect": 5,
    "gated_attention.analyze": 5,
    "gated_attention.demo": 5,
    "gated_attention.preflight": 5,
    "gated_attention.target_compile": 4,
    "gated_attention.convert": 5,
    "gated_attention.generate": 5,
    "gated_attention.evaluate_length": 5,
    "gated_attention.harness": 5,
    "gated_attention.intervene": 5,
    "gated_attention.pods": 5,
}
FLOOR_NAMES = ("ops", "sharding", "layers", "model", "train", "CLIs")

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
    matches = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    return FLOORS[max(matches, key=len)] if matches else None


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
    source = ("import json\nfrom gated_attention import sharding\n"
              "def f():\n    from gated_attention.ops import gating\n    from . import paths\n")
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {"gated_attention.x.mod", "gated_attention.sharding", "gated_attention.ops",
               "gated_attention.ops.gating", "gated_attention.x.paths"}
    project, external = imports_of("gated_attention.x.mod", path, modules)
    assert project == {"gated_attention.sharding", "gated_attention.ops.gating",
                       "gated_attention.x.paths"}
    assert external == {"json"}


# A module that imports the run config for type hints only.
TYPE_ONLY_IMPORT = ("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from gated_attention.config_lib import ModelConfig\n")


def test_import_reader_counts_type_only_imports(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(TYPE_ONLY_IMPORT)
    modules = {"gated_attention.x.mod", "gated_attention.config_lib"}
    project, _ = imports_of("gated_attention.x.mod", path, modules)
    assert project == {"gated_attention.config_lib"}


def test_an_upward_import_fails_the_floor_check(tmp_path):
    """Negative control: a layer naming the run config (even for a type only) is caught."""
    path = tmp_path / "attention.py"
    path.write_text(TYPE_ONLY_IMPORT)
    name = "gated_attention.layers.attention"
    project, _ = imports_of(name, path, set(package_modules()))
    assert upward_arrows({name: project}) == [
        "gated_attention.layers.attention (layers) -> gated_attention.config_lib (train)"]


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
    for module in ("gated_attention.layers.attention", "gated_attention.layers.block",
                   "gated_attention.layers.moe", "gated_attention.model"):
        assert "gated_attention.model_config" in graph[module], module
        assert "gated_attention.config_lib" not in graph[module], module


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
