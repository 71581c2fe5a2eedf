"""Megatron-LM's launch rewritten with the plan's layout flags (engines.megatron.export's layout_flags); a
Megatron-MoE-ModelZoo launch line (its layout in its variables, YAML map and runtime.conf) is refused, as is a
line that runs a script with the layout as its arguments (Pai-Megatron-Patch's).
"""

from __future__ import annotations

from pathlib import Path

from gplan.engines.megatron.export import KEEP_UNLESS_SET, layout_flags
from gplan.errors import InputError
from gplan.launch_text import FlagStyle, rewrite_launch
from gplan.plan import Plan, layouts_of


WRITES_BACK = (
    "the script, layout flags changed")
"""What `--out-launch` writes (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""

STYLE = FlagStyle(defaults={"--context-parallel-size": "1", "--tensor-model-parallel-size": "1",
                            "--pipeline-model-parallel-size": "1", "--expert-model-parallel-size": "1"},
                  multi_valued=("--recompute-modules",), anchor="--tensor-model-parallel-size")
"""Megatron's launch line: degrees at their default (1) are not added, --recompute-modules takes several
values (nargs="*"), missing flags go after the tensor-parallel one."""


def write_back(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    if "sbatch_benchmarking.sh" in text:
        raise InputError(f"{source} is a Megatron-MoE-ModelZoo launch line: its layout lives in its variables, the "
                         "YAML map and runtime.conf, which gplan does not rewrite",
                         hint="export the best plan: gplan export PLAN --to megatron")
    from gplan.launch_text import called_script

    called = called_script(source, text)
    if called is not None and "--tensor-model-parallel-size" not in text:
        raise InputError(f"{source} runs {called[0].name} with the layout as its arguments ($1, ${{10}} …), which gplan "
                         "does not rewrite", hint="export the best plan (gplan export PLAN --to megatron), or change "
                         "the arguments by hand to the plan's degrees")
    return {target: rewrite_launch(text, layout_flags(plan, layouts_of(plan)), STYLE, KEEP_UNLESS_SET)}
