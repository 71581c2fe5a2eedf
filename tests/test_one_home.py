"""Each rule and each engine fact has one home (issue: policy written more than once drifts):

  - the engines: engines, one file each — no other module lists three or more engines by name;
  - the configuration rules: spec/parallel's RULES — no other module words one of their refusals;
  - the default target: spec/targets' `default_target`, asked by the one target resolution
    (planner/inputs) and by `gplan launch` choosing a backend — nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import gplan
from gplan.engines import ENGINE_NAMES

PACKAGE = Path(gplan.__file__).parent


def sources() -> list[tuple[str, ast.AST]]:
    return [(str(path.relative_to(PACKAGE)), ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


def strings(node: ast.AST) -> set[str]:
    items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def test_no_module_outside_spec_engines_lists_the_engines():
    found = []
    for name, tree in sources():
        if name.startswith("engines/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                named = strings(node) & set(ENGINE_NAMES)
                if len(named) >= 3:
                    found.append(f"{name}:{node.lineno} {sorted(named)}")
    assert not found, "engines listed outside engines (read ENGINES instead): " + "; ".join(found)


#: A phrase of each configuration rule's refusal, which only its rule may word.
RULE_WORDS = ("does not divide the model's heads", "does not divide ffn_hidden_size", "does not divide the expert FFN",
              "does not fold into a stage's", "needs sequence parallelism", "is not a multiple of mbs·dp",
              "needs micro-batches", "does not split into 2·cp", "do not fill pp·vpp", "exceeds the model's",
              "expert parallelism does not train in fp16")


def test_each_configuration_rule_is_worded_once_in_spec_parallel():
    found = []
    for name, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [(phrase, name) for phrase in RULE_WORDS if phrase in node.value]
    homes = {phrase: sorted({name for p, name in found if p == phrase}) for phrase in RULE_WORDS}
    assert all(names == ["spec/parallel.py"] for names in homes.values()), homes


def test_the_default_target_is_decided_in_one_place():
    defined, asked = [], []
    for name, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "default_target":
                defined.append(name)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "default_target":
                asked.append(name)
    assert defined == ["spec/targets.py"]
    assert set(asked) == {"planner/inputs.py", "backends/registry.py"}, asked
