"""The import direction of DESIGN.md §2: planner, cost models, spec and profiles' catalogue code never
import a framework or a backend; plan-side code is importable without torch or mindspore."""

from __future__ import annotations

import ast
from pathlib import Path

import gplan

PACKAGE = Path(gplan.__file__).parent
FORBIDDEN = {"torch", "mindspore"}
PLANNING_SIDE = ["planner", "cost_models", "spec", "plan.py", "inputs.py", "render.py", "errors.py", "report.py", "svg.py"]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def planning_files() -> list[Path]:
    files = []
    for entry in PLANNING_SIDE:
        target = PACKAGE / entry
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    files += [p for p in (PACKAGE / "profiles").glob("*.py")]
    return files


def test_planning_side_never_imports_a_framework_or_backend():
    offenders = []
    for path in planning_files():
        for module in imported_modules(path):
            root = module.split(".")[0]
            if root in FORBIDDEN or module.startswith("gplan.backends") or module.startswith("gplan.cli"):
                offenders.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not offenders, offenders


def test_cost_models_do_not_import_the_planner():
    for path in (PACKAGE / "cost_models").rglob("*.py"):
        assert not any(m.startswith("gplan.planner") for m in imported_modules(path)), path


def test_the_checker_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.distributed\nfrom mindspore import nn\n")
    assert imported_modules(probe) == {"torch.distributed", "mindspore"}


def test_launchers_import_no_framework():
    """`gplan launch --dry-run` and `--slurm` work where torch is not installed."""
    for path in [PACKAGE / "backends" / "__init__.py", PACKAGE / "backends" / "scale.py",
                 PACKAGE / "backends" / "torch" / "__init__.py", PACKAGE / "backends" / "torch" / "launcher.py"]:
        assert not {m.split(".")[0] for m in imported_modules(path)} & FORBIDDEN, path
