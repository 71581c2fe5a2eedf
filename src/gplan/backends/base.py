"""What every execution backend provides (DESIGN.md §9); `gplan launch --backend NAME` picks one.

    render(plan, plan_path, options) -> LaunchSpec   argv and environment of every node; pure
    validate(plan) -> list of per-stage checks        the sharded model at full scale, no accelerator
    run(spec, options, echo) -> None                  this node's processes; BackendError when one fails

A launcher module implements `render` and `run` without importing its framework; `validate` imports
it lazily.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from gplan.plan import Plan


class Backend(Protocol):
    def render(self, plan: Plan, plan_path: Path, options: Any) -> Any: ...

    def validate(self, plan: Plan) -> list[Any]: ...

    def run(self, spec: Any, options: Any, echo: Callable[[str], None]) -> None: ...

    def slurm_script(self, plan: Plan, plan_path: Path, options: Any) -> str: ...


def torch_backend() -> Backend:
    """The torch backend as a Backend (its launcher functions, its validator imported on use)."""
    from types import SimpleNamespace

    from gplan.backends.torch import launcher

    def validate(plan: Plan) -> list[Any]:
        from gplan.backends.torch.validate import validate_plan

        return validate_plan(plan)

    return SimpleNamespace(render=launcher.render, validate=validate, run=launcher.run,
                           slurm_script=launcher.slurm_script)


def mindspore_backend() -> Backend:
    """The MindSpore backend: msrun; its dry validation checks the plan's operator strategies."""
    from types import SimpleNamespace

    from gplan.backends.mindspore import launcher
    from gplan.backends.mindspore.strategy import check_layout

    return SimpleNamespace(render=launcher.render, validate=check_layout, run=launcher.run,
                           slurm_script=launcher.slurm_script)


BACKENDS: dict[str, Callable[[], Backend]] = {"torch": torch_backend, "mindspore": mindspore_backend}
"""`gplan launch --backend` names."""
