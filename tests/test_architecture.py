"""The import contract (docs/design.md, "Layers"): data flows one way,

    errors, io, numeric, launch_text  <  spec, engines  <  profiles  <  plan, report  <  cost_models  <  planner
                         <  calibration  <  backends  <  cli (cli.py, cli_run.py, render.py, html_report.py, recovery.py)

A module imports only its own layer and the layers below it — top-level, lazy and relative imports, and
modules named by a string (importlib, `module:function`) alike; below the backends, only the standard library
and the declared planning dependencies; and no module imports itself round a circle. Two
narrower rules: backends read only the plan, the run report, spec, profiles, io and launch_text (never the cost
model, the planner or the calibration), and the torch and MindSpore backends never import each other.
Nothing below backends imports a framework (torch, mindspore) or an engine. An engine folder's parts sit
in the layers of what they do (ENGINE_PART_UNITS), and a module asks for an engine part (`engine_parts("launch")`)
only from that part's layer or above."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import networkx as nx

import pytest

import gplan

PACKAGE = Path(gplan.__file__).parent
LAYERS = [
    {"gplan", "gplan.errors", "gplan.io", "gplan.numeric", "gplan.launch_text"},
    {"gplan.spec", "gplan.engines"},
    {"gplan.profiles"},
    {"gplan.plan", "gplan.report"},
    {"gplan.cost_models"},
    {"gplan.planner"},
    {"gplan.calibration"},
    {"gplan.backends"},
    {"gplan.cli", "gplan.cli_base", "gplan.cli_run", "gplan.render", "gplan.html_report", "gplan.recovery"},
]
BACKENDS_MAY_READ = {"gplan", "gplan.errors", "gplan.io", "gplan.launch_text", "gplan.spec", "gplan.engines",
                     "gplan.profiles", "gplan.plan", "gplan.report", "gplan.backends"}
ENGINE_PART_UNITS = {"flags": "gplan.planner", "arguments": "gplan.planner", "model_zoo": "gplan.planner",
                     "logs": "gplan.planner", "launch": "gplan.planner", "registry": "gplan.planner",
                     "export": "gplan.backends",
                     "write_back": "gplan.backends"}
"""An engine folder (gplan.engines.<folder>) spans the layers: its profile (the package itself) with spec,
each part in the layer of what it does — reading launches and logs with the planner, writing files with the
backends (and bound by what backends may read)."""
FRAMEWORKS = {"torch", "mindspore", "megatron", "torchtitan", "deepspeed", "mindformers", "triton"}
PLANNING_DEPENDENCIES = {"numpy", "networkx", "pulp", "highspy", "pydantic", "yaml", "typer", "rich", "click"}
"""What a module below the backends may import besides the standard library and gplan: the declared
dependencies of planning (pyproject.toml), so a framework or engine missing from FRAMEWORKS is caught too."""


def unit_of(module: str) -> str:
    """The contract unit of a module: an engine part's by its name (ENGINE_PART_UNITS), else the longest
    layer entry that is it or contains it."""
    parts = module.split(".")
    if parts[:2] == ["gplan", "engines"] and len(parts) > 3:
        if parts[3] not in ENGINE_PART_UNITS:
            raise AssertionError(f"{module}: an engine part of no known kind: add it to ENGINE_PART_UNITS")
        return ENGINE_PART_UNITS[parts[3]]
    entries = sorted((e for layer in LAYERS for e in layer), key=len, reverse=True)
    for entry in entries:
        if module == entry or module.startswith(entry + "."):
            return entry
    raise AssertionError(f"{module} is in no layer of the contract: add it")


def layer_of(module: str) -> int:
    unit = unit_of(module)
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def violation(module: str, imported: str) -> str | None:
    """Why `module` may not import `imported` (None when it may)."""
    root = imported.split(".")[0]
    if root != "gplan":
        if layer_of(module) >= layer_of("gplan.backends") or root in sys.stdlib_module_names | PLANNING_DEPENDENCIES:
            return None
        kind = "the framework" if root in FRAMEWORKS else "the undeclared package"
        return f"{module} imports {kind} {imported}"
    if layer_of(imported) > layer_of(module):
        return f"{module} (layer {unit_of(module)}) imports {imported} (layer {unit_of(imported)}, above it)"
    if unit_of(module) == "gplan.backends" and unit_of(imported) not in BACKENDS_MAY_READ:
        return f"{module}: backends read only the plan, report, spec, profiles and io, not {imported}"
    for a, b in (("gplan.backends.torch", "gplan.backends.mindspore"), ("gplan.backends.mindspore", "gplan.backends.torch")):
        if module.startswith(a) and imported.startswith(b):
            return f"{module} imports the other backend ({imported})"
    return None


MODULE_STRING = re.compile(r"gplan(?:\.\w+)+(?=$|:)")
"""A string naming a module, as `importlib.import_module("gplan.x")`, a `module:function` entry point or
`python -m gplan.x` take it: an import all the same."""


def imports_of(path: Path, module: str | None = None) -> set[str]:
    """Every module a file imports, at the top or inside a function (`from a import b` counts as
    `a.b` too, so importing a submodule by name is seen), relative imports resolved against `module`
    (default: the file's own name in the package), and every module named by a string constant."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            modules = {f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")}
            names |= modules
            if len(modules) < len(node.names):  # a name defined by the module (or package) itself
                names.add(base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := MODULE_STRING.match(node.value)):
            if _is_module(m.group(0)):
                names.add(m.group(0))
    return names


def _is_module(name: str) -> bool:
    if not name.startswith("gplan."):
        return False
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_keeps_the_import_contract():
    found = [v for path in all_modules() for imported in sorted(imports_of(path))
             if (v := violation(module_name(path), imported))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module, imported", [
    # The imports this contract was written to end (issue 12), each of which it must refuse.
    ("gplan.backends.scale", "gplan.planner.build"),
    ("gplan.backends.torch.worker", "gplan.cost_models.compute"),
    ("gplan.backends.mindspore.worker", "gplan.cost_models.compute"),
    ("gplan.profiles.measure.layers", "gplan.backends.torch.model"),
    ("gplan.profiles.measure.layers_mindspore", "gplan.backends.mindspore.worker"),
    ("gplan.profiles.measure.profile", "gplan.cost_models.compute"),
    ("gplan.spec.loaders", "gplan.profiles.catalogue"),
    ("gplan.plan", "gplan.cost_models.step"),
    ("gplan.backends.mindspore.launcher", "gplan.backends.torch.launcher"),
    ("gplan.engines.mindformers.export", "gplan.planner.build"),
    ("gplan.planner.search", "torch"),
    ("gplan.cost_models.step", "gplan.planner.table"),
    ("gplan.calibration.runs", "gplan.backends.torch.launcher"),
])
def test_the_contract_refuses_the_old_upward_imports(module, imported):
    assert violation(module, imported) is not None


def test_the_checker_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.distributed\n\ndef f():\n    from mindspore import nn\n    from gplan.planner import ilp\n")
    assert {"torch.distributed", "mindspore", "gplan.planner.ilp"} <= imports_of(probe, "gplan.cost_models.probe")


def planted(tmp_path, text: str, module: str = "gplan.cost_models.probe") -> list[str]:
    """The contract's violations in a module `text` planted at `module`."""
    probe = tmp_path / "probe.py"
    probe.write_text(text)
    return [v for imported in sorted(imports_of(probe, module)) if (v := violation(module, imported))]


def test_the_checker_sees_a_relative_upward_import(tmp_path):
    assert planted(tmp_path, "from ..planner import ilp\n")
    assert planted(tmp_path, "def f():\n    from ..planner.search import search\n")
    assert not planted(tmp_path, "from .compute import layer_time_s\nfrom .. import errors\n")


def test_the_checker_sees_an_import_by_name(tmp_path):
    assert planted(tmp_path, "import importlib\n\ndef f():\n    return importlib.import_module('gplan.planner.search')\n")
    assert planted(tmp_path, "WORKER = 'gplan.backends.torch.validate:validation_report'\n")


def test_the_checker_sees_a_framework_it_does_not_list(tmp_path):
    assert planted(tmp_path, "import jax\n")
    assert planted(tmp_path, "def f():\n    import tensorflow as tf\n")
    assert not planted(tmp_path, "import json, numpy\nfrom pydantic import BaseModel\n")


def import_graph(extra: dict[str, set[str]] | None = None) -> nx.DiGraph:
    """Module → module it imports, over every file in the package (a package counts only where a name it
    defines itself is imported: importing a submodule runs its package's __init__ in any case)."""
    found = {module_name(path): imports_of(path) for path in all_modules()} | (extra or {})

    def owner(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph = nx.DiGraph()
    for module, imported in found.items():
        graph.add_node(module)
        graph.add_edges_from((module, o) for name in imported if (o := owner(name)) and o != module)
    return graph


def circles(graph: nx.DiGraph) -> list[list[str]]:
    return [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


def test_no_import_circle_anywhere():
    assert not circles(import_graph()), circles(import_graph())


def test_the_circle_check_sees_a_planted_circle():
    assert circles(import_graph({"gplan.backends.protocol": {"gplan.backends.launch"}}))


def part_requests(path: Path) -> set[str]:
    """The engine parts a module imports through gplan.engines by kind (`engine_parts("launch")`,
    `engine_part(e, "export")`); `has_part` only looks for the file, importing nothing."""
    kinds = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "engine_parts", "engine_part"):
            kinds |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return kinds


def part_violations(path: Path, module: str) -> list[str]:
    return [f"{module} (layer {unit_of(module)}) imports engine parts {kind!r} (layer {ENGINE_PART_UNITS[kind]})"
            for kind in sorted(part_requests(path) & ENGINE_PART_UNITS.keys())
            if layer_of(ENGINE_PART_UNITS[kind]) > layer_of(module)]


def test_engine_parts_are_asked_for_from_their_own_layer_or_above():
    found = [v for path in all_modules() for v in part_violations(path, module_name(path))]
    assert not found, "\n".join(found)


def test_the_checker_sees_an_engine_part_asked_for_from_below(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from gplan.engines import engine_parts\n\ndef f():\n    return engine_parts('launch')\n")
    assert part_violations(probe, "gplan.cost_models.probe")
    assert not part_violations(probe, "gplan.planner.probe")


def test_every_module_is_in_a_layer():
    for path in all_modules():
        unit_of(module_name(path))


def test_launchers_render_without_a_framework():
    """`gplan launch --dry-run` and `--slurm` work where torch and mindspore are not installed."""
    for name in ("backends/__init__.py", "backends/protocol.py", "backends/registry.py", "backends/launch.py",
                 "backends/recipes.py", "backends/slurm.py", "backends/supervisor.py", "backends/capability.py", "backends/torch/__init__.py",
                 "backends/torch/launcher.py", "backends/mindspore/launcher.py", "backends/exporters/__init__.py"):
        assert not {m.split(".")[0] for m in imports_of(PACKAGE / name)} & FRAMEWORKS, name
