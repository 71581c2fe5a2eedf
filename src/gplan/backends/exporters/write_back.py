"""A better plan written back into the user's own launch (`gplan search --from FILE --out-launch NEW`):
the launch as it was, with only the flags or keys of its layout changed — as the plan's export writes
them for that engine (the arguments each engine's own code was checked on) — and everything else
(data, tokenizer, checkpoints, learning-rate schedule, logging, the flags gplan does not own) kept.
Each engine's rewrite is its folder's write_back.py (gplan.engines).
"""

from __future__ import annotations

from pathlib import Path

from gplan.engines import ENGINES, engine_part, engine_parts
from gplan.errors import InputError
from gplan.launch_text import file_and_member
from gplan.plan import Plan


def write_back(plan: Plan, engine: str, source: Path, target: Path) -> dict[Path, str]:
    """The files to write: `target`, and whatever the engine's launch names beside it (a DeepSpeed config)."""
    part = engine_part(engine, "write_back") if engine in ENGINES else None
    if part is None:
        takes = ", ".join(ENGINES[name].title for name in engine_parts("write_back"))
        raise InputError(f"--out-launch rewrites {takes} launches, not {engine}'s", hint=f"gplan export PLAN --to {engine}")
    file = file_and_member(source)[0]  # `file::member`: a config registry's function (torchtitan 0.3)
    return part.write_back(plan, source, target, file.read_text())
