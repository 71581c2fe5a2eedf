"""gplan.engines: every engine gplan knows, one folder each, read by the targets, the memory model, the
launch readers, the exporters and `--target`."""

from __future__ import annotations

import typing

import pytest

from gplan.engines import ENGINE_NAMES, ENGINES, memory_accounting
from gplan.spec.parallel import (BATCH_RULES, DEGREE_RULES, EXPERT_RULES, PRICED_RULES, RECOMPUTE_RULES, RULES,
                                 SHARDING_RULES)
from gplan.spec.targets import LAUNCH_BACKENDS, TARGETS, how_to_run
from gplan.spec.training import Engine


def test_every_engine_is_a_target_a_plan_engine_and_has_its_way_to_run():
    assert tuple(TARGETS) == ENGINE_NAMES == typing.get_args(Engine)
    for name, engine in ENGINES.items():
        assert engine.capabilities.name == name
        assert engine.launches == (name in LAUNCH_BACKENDS)
        assert how_to_run(name)  # a launch, an export, or the engine's own launcher named


def test_the_exporters_are_the_engines_whose_folder_holds_one():
    from pathlib import Path

    import gplan.engines
    from gplan.backends.exporters import DEPLOYMENTS, targets

    root = Path(gplan.engines.__file__).parent
    holds = {n for n in ENGINES if (root / gplan.engines.FOLDERS[n] / "export.py").is_file()}
    assert set(targets()) == holds | set(DEPLOYMENTS)
    assert {"megatron", "torchtitan", "deepspeed", "mindformers"} <= holds and "llm-foundry" not in holds


def test_rule_groups_are_the_rules_each_once():
    groups = DEGREE_RULES + BATCH_RULES + SHARDING_RULES + EXPERT_RULES + RECOMPUTE_RULES + PRICED_RULES
    assert len(groups) == len(set(groups)) and set(groups) == set(RULES) and len(RULES) == len(set(RULES))


def test_a_plan_without_an_engine_keeps_memory_as_megatron_does():
    assert memory_accounting(None) == ENGINES["megatron"].memory
    assert memory_accounting("llm-foundry").loss_grad == "fused" and not memory_accounting("llm-foundry").fp32_logits


def test_llm_foundry_is_a_target_its_plans_shard_data_parallel_alone(gplan, tmp_path):
    """llm-foundry (FSDP over data parallelism, no tp/pp/cp) is priced by the bench (S21): a user can
    name it, and its search keeps to what it runs."""
    out = tmp_path / "plan.json"
    r = gplan("search", "llama3-8b", "--devices", "64", "--cluster", "dgx-a100-80g", "--target", "llm-foundry",
              "--out", str(out), "--json")
    assert r.code == 0, r.stderr
    for row in r.json()["ranked"]:
        c = row["parallel"]
        assert (c["tp"], c["pp"], c["cp"]) == (1, 1, 1) and c["zero"] in (0, 2, 3)
    r = gplan("estimate", "llama3-8b", "--devices", "64", "--cluster", "dgx-a100-80g", "--target", "llm-foundry",
              "--tp", "2")
    assert r.code == 3 and "llm-foundry would not run this configuration" in r.stderr and "tensor parallelism" in r.stderr


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_each_engine_file_documents_its_source(name):
    import importlib

    from gplan.engines import FOLDERS

    module = importlib.import_module(f"gplan.engines.{FOLDERS[name]}")
    assert module.ENGINE is ENGINES[name] and len(module.__doc__ or "") > 80
