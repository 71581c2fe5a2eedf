"""A NeMo AutoModel recipe rewritten with the best plan (`gplan search --from recipe.yaml --out-launch new.yaml`):
the keys of its `distributed` section and its step scheduler's batch, as the export writes them, line by line
so that comments, the model, the data, the optimizer and every other key stay. A recipe whose pipeline section
the plan drops (pp 1) is refused: AutoModel refuses a pipeline section without pipeline stages, and gplan does
not delete a user's keys."""

from __future__ import annotations

from pathlib import Path

from gplan.backends.exporters import ExportContext
from gplan.engines.nemo_automodel.export import recipe
from gplan.errors import InputError
from gplan.launch_text import rewrite_yaml
from gplan.plan import Plan, layouts_of


WRITES_BACK = (
    "the recipe's `distributed` and batch keys, line by line (comments and every other key kept)")
"""What `--out-launch` writes (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""

OWNED = ("step_scheduler", "distributed")
"""The recipe's sections whose layout keys the plan sets (the others are the user's)."""


def write_back(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    import yaml

    written = recipe(plan, ExportContext(layouts_of(plan)))
    current = yaml.safe_load(text) or {}
    if plan.parallel.pp == 1 and ((current.get("distributed") or {}).get("pipeline")):
        raise InputError(f"{source}: the best plan runs no pipeline stages, and AutoModel refuses the recipe's "
                         "distributed.pipeline section without them", hint="remove distributed.pipeline from the "
                         "recipe, or export the best plan: gplan export PLAN --to nemo-automodel")
    values: dict[str, object] = {}
    for section in OWNED:
        for key, value in written[section].items():
            if isinstance(value, dict):
                values |= {f"{section}.{key}.{k}": v for k, v in value.items()}
            else:
                values[f"{section}.{key}"] = value
    return {target: rewrite_yaml(text, values)}
