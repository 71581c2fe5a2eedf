"""A MindFormers PyNative trainer YAML rewritten: its `training` batch, `parallelism` degrees and split and
`recompute` ranges (the export's sections), line by line so comments, its model and every other key stay."""

from __future__ import annotations

from pathlib import Path

from gplan.launch_text import rewrite_yaml
from gplan.plan import Plan

WRITES_BACK = "the YAML's `training` batch, `parallelism` and `recompute` keys, line by line (comments and every other key kept)"
"""What `--out-launch` writes (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""

OWNED = ("training", "parallelism", "recompute")
"""The export's sections a write-back replaces key by key (the model stays the user's)."""


def write_back(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    from gplan.engines.mindformers_pynative.export import sections

    written = sections(plan)
    return {target: rewrite_yaml(text, {f"{section}.{key}": value for section in OWNED
                                        for key, value in written[section].items()})}
