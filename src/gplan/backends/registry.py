"""The backends gplan launches with, by name (`gplan launch --backend NAME`), each a launcher module and a
validator found on use — so naming one imports no framework."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gplan.backends.protocol import Backend, LaunchOptions, LaunchSpec, ValidationReport
from gplan.errors import BackendError
from gplan.plan import Plan


@dataclass(frozen=True)
class ModuleBackend:
    """A backend whose launcher module renders and runs without its framework, and whose validator
    (`module:function`) is imported on use."""

    name: str
    launcher: str
    validator: str
    validator_needs_framework: bool
    measurer: str
    """`module:Class` of its layer and link measurer (`gplan profile`), imported on use."""
    writes_traces: bool = False
    loads_other_layouts: bool = False

    def _launcher(self):
        return importlib.import_module(self.launcher)

    def render(self, plan: Plan, plan_path: Path, options: LaunchOptions) -> LaunchSpec:
        return self._launcher().render(plan, plan_path, options)

    def slurm_script(self, plan: Plan, plan_path: Path, options: LaunchOptions) -> str:
        return self._launcher().slurm_script(plan, plan_path, options)

    def validate(self, plan: Plan) -> ValidationReport:
        if self.validator_needs_framework:
            require_framework(self.name)
        module, function = self.validator.split(":")
        return getattr(importlib.import_module(module), function)(plan)

    def run(self, spec: LaunchSpec, options: LaunchOptions, echo: Callable[[str], None]) -> None:
        self._launcher().run(spec, options, echo)


BACKENDS: dict[str, Backend] = {
    "torch": ModuleBackend("torch", "gplan.backends.torch.launcher", "gplan.backends.torch.validate:validation_report",
                           validator_needs_framework=True, measurer="gplan.backends.torch.measure:TorchMeasurer",
                           writes_traces=True, loads_other_layouts=True),
    "mindspore": ModuleBackend("mindspore", "gplan.backends.mindspore.launcher",
                               "gplan.backends.mindspore.strategy:validation_report", validator_needs_framework=False,
                               measurer="gplan.backends.mindspore.measure:MindSporeMeasurer"),
}
"""`gplan launch --backend` names. torch validates on a fake process group (torch needed); MindSpore
checks its operator strategies, which are pure data. Only torch writes profiler traces and loads another
layout's checkpoint (torch.distributed.checkpoint)."""


def backend(name: str) -> Backend:
    from gplan.errors import InputError

    if name not in BACKENDS:
        raise InputError(f"--backend {name!r} is not available in this gplan", hint="use --backend torch or mindspore")
    return BACKENDS[name]


def default_backend(plan: Plan) -> tuple[str, str]:
    """The backend a plan launches on without --backend, and why: its target when gplan launches that
    itself, else MindSpore on Ascend hardware and torch on the rest."""
    from gplan.spec.targets import default_target

    if plan.target in BACKENDS:
        return plan.target, "the plan's target"
    return default_target(plan.cluster.primary.hardware.kind), "the plan's hardware"


def require_framework(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise BackendError(f"the {name} backend needs {name} installed", hint=f"pip install -e '.[{name}]'")


def measurer(name: str):
    """The layer and link measurer of a backend (`gplan profile`), a calibration.profile.Measurer."""
    from gplan.errors import InputError

    if name not in BACKENDS:
        raise InputError(f"--backend {name!r}: gplan profiles with torch or mindspore", hint="use --backend torch")
    require_framework(name)
    module, cls = BACKENDS[name].measurer.split(":")
    return getattr(importlib.import_module(module), cls)()
