"""Each rule and each engine fact has one home (issue: policy written more than once drifts):

  - the engines: engines/, one folder each — no other module lists three or more engines by name, branches
    on an engine's name (compares to it, matches it, looks an engine up by it) or names an engine's flags
    (gplan's own command-line options that share a Megatron flag's name excepted);
  - the configuration rules: spec/parallel's RULES — no other module words one of their refusals or
    restates one of their predicates (a divisibility test of the same quantities);
  - the default target: spec/targets' `default_target`, asked by the one target resolution
    (planner/inputs), by `gplan launch` choosing a backend and by replan asking which backend launched a
    plan that names none — nowhere else."""

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


def test_no_module_outside_the_engine_folders_lists_the_engines():
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


ENGINE_FLAG_PARTS = ("flags.py", "launch.py", "arguments.py")
LAUNCH_SECTIONS = ("parallelism.", "training.", "activation_checkpoint.", "parallel_config.", "recompute_config.",
                   "runner_config.")


def _literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_literals(e) for e in node.elts)) if node.elts else set()
    return set()


def engine_name_branches(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module compares a value to an engine's name, matches one, or looks one up by it."""
    names, found = set(ENGINE_NAMES), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = set().union(*(_literals(x) for x in [node.left, *node.comparators])) & names
        elif isinstance(node, ast.MatchValue):
            hit = _literals(node.value) & names
        elif isinstance(node, ast.Subscript):
            hit = _literals(node.slice) & names
        else:
            continue
        if hit:
            found.append((node.lineno, ", ".join(sorted(hit))))
    return found


def test_no_module_outside_the_engine_folders_branches_on_an_engine_name():
    found = [f"{name}:{line} ({hit})" for name, tree in sources() if not name.startswith("engines/")
             for line, hit in engine_name_branches(tree)]
    assert not found, "engine-name branches outside engines/ (ask the engine's profile or part): " + "; ".join(found)


def test_the_branch_check_sees_a_planted_branch():
    for text in ('if engine == "megatron":\n    pass\n', 'x = engine in ("deepspeed", "torchtitan")\n',
                 'match target:\n    case "mindformers":\n        pass\n', 'accounting = ENGINES["torchtitan"].memory\n'):
        assert engine_name_branches(ast.parse(text)), text
    assert not engine_name_branches(ast.parse('BACKENDS = {"torch": 1}\nif kind == "gpu":\n    pass\n'))


def engine_folder_imports(tree: ast.AST) -> set[str]:
    """The engine folders a module imports by name (`gplan.engines.megatron…`), not through the registry."""
    from gplan.engines import FOLDERS

    folders, found = set(FOLDERS.values()), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["gplan", "engines"] and len(parts) > 2 and parts[2] in folders:
                found.add(parts[2])
    return found


def test_no_module_outside_the_engine_folders_imports_one_by_name():
    """Adding an engine touches no code outside its folder: everything else finds engines through the
    registry (ENGINES, engine_parts), never by importing one engine's folder."""
    found = [f"{name}: {sorted(hit)}" for name, tree in sources() if not name.startswith("engines/")
             if (hit := engine_folder_imports(tree))]
    assert not found, "engine folders imported by name outside engines/: " + "; ".join(found)


def test_the_folder_import_check_sees_a_planted_import():
    assert engine_folder_imports(ast.parse("from gplan.engines.megatron.export import layout_flags\n")) == {"megatron"}
    assert engine_folder_imports(ast.parse("from gplan.engines import torchtitan\n")) == {"torchtitan"}
    assert not engine_folder_imports(ast.parse("from gplan.engines import ENGINES, engine_parts\n"))


def engine_flags() -> set[str]:
    """Every flag or dotted config key an engine folder names where it reads or classifies launches."""
    found = set()
    for name, tree in sources():
        if name.startswith("engines/") and name.endswith(ENGINE_FLAG_PARTS):
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value and (
                        node.value.startswith("--") and len(node.value) > 3 or node.value.startswith(LAUNCH_SECTIONS)):
                    found.add(node.value)
    return found


def own_options() -> set[str]:
    """gplan's own command-line options (cli*.py), some of which share a Megatron flag's name."""
    return {node.value for name, tree in sources() if name.startswith("cli") for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--")}


def flags_named(tree: ast.AST, flags: set[str]) -> set[str]:
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in flags}


def test_no_module_outside_the_engine_folders_names_an_engine_flag():
    flags = engine_flags() - own_options()
    assert {"--tensor-model-parallel-size", "parallelism.data_parallel_shard_degree"} <= flags
    found = [f"{name}: {sorted(hit)}" for name, tree in sources() if not name.startswith(("engines/", "cli"))
             if (hit := flags_named(tree, flags))]
    assert not found, "engine flags named outside engines/: " + "; ".join(found)


def test_the_flag_check_sees_a_planted_flag_list():
    flags = engine_flags() - own_options()
    assert flags_named(ast.parse('OWNED = ("--pipeline-model-parallel-size", "--micro-batch-size")\n'), flags)
    assert not flags_named(ast.parse('OPTIONS = ("--devices", "--cluster")\n'), flags)


def _shape(node: ast.AST) -> str:
    """An expression with each attribute read as its bare name (`c.ep`, `config.ep`, `ep` alike)."""
    class Bare(ast.NodeTransformer):
        def visit_Attribute(self, n):
            return ast.Name(id=n.attr)

        def visit_Name(self, n):
            return ast.Name(id=n.id)
    return ast.dump(Bare().visit(ast.parse(ast.unparse(node), mode="eval").body), annotate_fields=False)


def rule_predicates() -> dict[str, str]:
    """The divisibility tests of spec/parallel's rules (`model.num_experts % c.ep`) and of the predicates
    there they call (`experts_split`), by shape -> rule (or predicate)."""
    from gplan.spec.parallel import RULES

    tree = ast.parse((PACKAGE / "spec" / "parallel.py").read_text())
    functions = {fn.name: fn for fn in tree.body if isinstance(fn, ast.FunctionDef)}
    model_class = next(c for c in ast.parse((PACKAGE / "spec" / "model.py").read_text()).body
                       if isinstance(c, ast.ClassDef) and c.name == "ModelSpec")
    methods = {fn.name: fn for fn in model_class.body if isinstance(fn, ast.FunctionDef)}
    homes = {r.__name__ for r in RULES}
    for name in list(homes):  # the predicates a rule calls: spec/parallel's functions, ModelSpec's methods
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in functions:
                homes.add(node.func.id)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in methods:
                functions[node.func.attr] = methods[node.func.attr]
                homes.add(node.func.attr)
    for name in [h for h in homes if h in methods]:  # and the methods those call
        for node in ast.walk(methods[name]):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in methods:
                functions[node.func.attr] = methods[node.func.attr]
                homes.add(node.func.attr)
    found = {}
    for name in sorted(homes):
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and len(
                    {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} |
                    {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}) >= 2:
                found.setdefault(_shape(node), name)
    return found


def restated_predicates(tree: ast.AST, predicates: dict[str, str]) -> list[tuple[int, str]]:
    return [(node.lineno, predicates[_shape(node)]) for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _shape(node) in predicates]


def test_no_module_restates_a_configuration_rule_predicate():
    predicates = rule_predicates()
    assert len(predicates) >= 8
    homes = {"spec/parallel.py", "spec/model.py"}  # the rules, and the model's own predicates they call
    found = [f"{name}:{line} restates {rule}" for name, tree in sources() if name not in homes
             for line, rule in restated_predicates(tree, predicates)]
    assert not found, "; ".join(found)


def test_the_predicate_check_sees_a_planted_restatement():
    predicates = rule_predicates()
    planted = ast.parse("def experts(model, ep):\n    return [e for e in ep if not model.num_experts % e]\n"
                        "def fits(config, model):\n    return model.num_experts % config.ep == 0\n"
                        "def pool(model, ep):\n    return model.num_experts % ep == 0\n")
    assert [rule for _, rule in restated_predicates(planted, predicates)] == ["experts_split", "experts_split"]


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
    # the one target resolution, `gplan launch`'s backend, and replan asking what launched a plan naming none
    assert set(asked) == {"planner/inputs.py", "backends/registry.py", "planner/replan.py"}, asked
