"""The import contract (docs/design.md, "Layers"): data flows one way,

    errors, io, numeric, launch_text  <  spec  <  profiles  <  plan, report  <  cost_models  <  planner
                         <  calibration  <  backends  <  cli (cli.py, cli_run.py, render.py, svg.py, html_report.py, recovery.py)

A module imports only its own layer and the layers below it — top-level and lazy imports alike. Two
narrower rules: backends read only the plan, the run report, spec, profiles, io and launch_text (never the cost
model, the planner or the calibration), and the torch and MindSpore backends never import each other.
Nothing below backends imports a framework (torch, mindspore) or an engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gplan

PACKAGE = Path(gplan.__file__).parent
LAYERS = [
    {"gplan", "gplan.errors", "gplan.io", "gplan.numeric", "gplan.launch_text"},
    {"gplan.spec"},
    {"gplan.profiles"},
    {"gplan.plan", "gplan.report"},
    {"gplan.cost_models"},
    {"gplan.planner"},
    {"gplan.calibration"},
    {"gplan.backends"},
    {"gplan.cli", "gplan.cli_base", "gplan.cli_run", "gplan.render", "gplan.svg", "gplan.html_report", "gplan.recovery"},
]
BACKENDS_MAY_READ = {"gplan", "gplan.errors", "gplan.io", "gplan.launch_text", "gplan.spec", "gplan.profiles", "gplan.plan",
                     "gplan.report", "gplan.backends"}
FRAMEWORKS = {"torch", "mindspore", "megatron", "torchtitan", "deepspeed", "mindformers", "triton"}


def unit_of(module: str) -> str:
    """The contract unit of a module: the longest layer entry that is it or contains it."""
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
    if root in FRAMEWORKS:
        return None if layer_of(module) >= layer_of("gplan.backends") else f"{module} imports the framework {imported}"
    if root != "gplan":
        return None
    if layer_of(imported) > layer_of(module):
        return f"{module} (layer {unit_of(module)}) imports {imported} (layer {unit_of(imported)}, above it)"
    if unit_of(module) == "gplan.backends" and unit_of(imported) not in BACKENDS_MAY_READ:
        return f"{module}: backends read only the plan, report, spec, profiles and io, not {imported}"
    for a, b in (("gplan.backends.torch", "gplan.backends.mindspore"), ("gplan.backends.mindspore", "gplan.backends.torch")):
        if module.startswith(a) and imported.startswith(b):
            return f"{module} imports the other backend ({imported})"
    return None


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function (`from a import b` counts as
    `a.b` too, so importing a submodule by name is seen)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
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
    ("gplan.backends.exporters.mindformers", "gplan.planner.build"),
    ("gplan.planner.search", "torch"),
    ("gplan.cost_models.step", "gplan.planner.table"),
    ("gplan.calibration.runs", "gplan.backends.torch.launcher"),
])
def test_the_contract_refuses_the_old_upward_imports(module, imported):
    assert violation(module, imported) is not None


def test_the_checker_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.distributed\n\ndef f():\n    from mindspore import nn\n    from gplan.planner import ilp\n")
    assert {"torch.distributed", "mindspore", "gplan.planner", "gplan.planner.ilp"} <= imports_of(probe)


def test_every_module_is_in_a_layer():
    for path in all_modules():
        unit_of(module_name(path))


def test_launchers_render_without_a_framework():
    """`gplan launch --dry-run` and `--slurm` work where torch and mindspore are not installed."""
    for name in ("backends/__init__.py", "backends/base.py", "backends/launch.py", "backends/torch/__init__.py",
                 "backends/torch/launcher.py", "backends/mindspore/launcher.py", "backends/exporters/__init__.py"):
        assert not {m.split(".")[0] for m in imports_of(PACKAGE / name)} & FRAMEWORKS, name
