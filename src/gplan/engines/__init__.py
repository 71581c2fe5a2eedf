"""Every engine gplan knows, one folder each (`engines/<folder>/`), found here — nothing else lists engines
(tests/test_one_home.py keeps it so):

    __init__.py     ENGINE, its EngineProfile: what it runs (spec.targets reads its capabilities), how it
                    keeps memory (cost_models.memory), where its speed lives (the catalogue's efficiency)
    flags.py        its launch flags or config keys, named once: read, no effect (why), refused (why)
    launch.py       its launch files and logs read as a planner.launch.Launch (`--from`, `calibrate`)
    logs.py         its training logs parsed: the configuration they print, the steady step
    export.py       `gplan export --to NAME`: the plan in its files, checked by its own code where installed
    write_back.py   `search --from FILE --out-launch NEW`: the best plan written into the user's launch

An engine has the parts it needs (gplan's own workers only a profile). Each part sits in the import layer
of what it does (tests/test_architecture.py: the profile with spec, flags, launch and logs with the
planner, export and write_back with the backends) and is found through `engine_parts(kind)` by the layer
that owns `kind`. Adding an engine is one folder here and its tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from gplan.engines.profile import NO_ENGINE, EngineProfile, MemoryAccounting


def _discover() -> dict[str, tuple[EngineProfile, str]]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            found.append((importlib.import_module(f"{__name__}.{info.name}").ENGINE, info.name))
    return {e.name: (e, folder) for e, folder in sorted(found, key=lambda item: item[0].order)}


_FOUND = _discover()
ENGINES: dict[str, EngineProfile] = {name: engine for name, (engine, _) in _FOUND.items()}
FOLDERS: dict[str, str] = {name: folder for name, (_, folder) in _FOUND.items()}
"""Engine name -> its folder here (`llm-foundry` lives in `llm_foundry/`)."""
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
"""What `--target` takes, in the order lists show them."""
LAUNCH_BACKENDS: tuple[str, ...] = tuple(name for name, engine in ENGINES.items() if engine.launches)
"""The targets `gplan launch` runs itself; the others are reached through `gplan export`."""


def profile_of(engine: str | None) -> EngineProfile:
    """`engine`'s profile; NO_ENGINE for a run priced for none (its every field at the default)."""
    return ENGINES[engine] if engine else NO_ENGINE


def memory_accounting(engine: str | None) -> MemoryAccounting:
    return profile_of(engine).memory


def has_part(engine: str, kind: str) -> bool:
    """Whether `engine`'s folder holds a `kind` part (launch, logs, export, write_back, flags)."""
    folder = FOLDERS.get(engine)
    return folder is not None and (Path(__file__).parent / folder / f"{kind}.py").is_file()


def engine_parts(kind: str) -> dict[str, ModuleType]:
    """Each engine's `kind` module, in the engines' order, for the engines that have one (imported here:
    call it from the layer `kind` belongs to)."""
    return {name: importlib.import_module(f"{__name__}.{FOLDERS[name]}.{kind}") for name in ENGINES
            if has_part(name, kind)}


def engine_part(engine: str, kind: str) -> ModuleType | None:
    """`engine`'s `kind` module, or None where it has none."""
    return importlib.import_module(f"{__name__}.{FOLDERS[engine]}.{kind}") if has_part(engine, kind) else None
