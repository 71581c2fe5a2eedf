"""Every engine gplan prices, one file each: what it runs (spec.targets reads its capabilities), how it
keeps memory (cost_models.memory reads its accounting), where its speed lives (the hardware catalogue's
`engine_efficiency`), and what hands a plan to it (an exporter of gplan.backends.exporters, or
`gplan launch`). Adding an engine is one file here with its ENGINE, and its tests; nothing else lists
engines (tests/test_one_home.py keeps it so)."""

from __future__ import annotations

import importlib
import pkgutil

from gplan.spec.engines.profile import EngineProfile, MemoryAccounting


def _discover() -> dict[str, EngineProfile]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name != "profile":
            found.append(importlib.import_module(f"{__name__}.{info.name}").ENGINE)
    return {e.name: e for e in sorted(found, key=lambda e: e.order)}


ENGINES: dict[str, EngineProfile] = _discover()
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
"""What `--target` takes, in the order lists show them."""
DEFAULT_ACCOUNTING = MemoryAccounting()
"""A plan with no engine is priced as Megatron keeps memory."""


def memory_accounting(engine: str | None) -> MemoryAccounting:
    profile = ENGINES.get(engine or "")
    return profile.memory if profile else DEFAULT_ACCOUNTING
