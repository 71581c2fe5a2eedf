"""The devices gplan's MindSpore backend runs, and which one this process has (imports MindSpore only when
asked, so the launcher reads the declaration without it)."""

from __future__ import annotations

RUNS_ON = {"npu": "Ascend", "gpu": "GPU", "cpu": "CPU"}
"""Hardware kind (profiles.schema.HardwareSpec.kind) → MindSpore's device_target, declared: a plan priced on
any other kind is refused before anything starts."""


def has_ascend() -> bool:
    import mindspore as ms

    try:
        return bool(ms.hal.is_available("Ascend"))
    except (AttributeError, RuntimeError, ValueError):
        return False
