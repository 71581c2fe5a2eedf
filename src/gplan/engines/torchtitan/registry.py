"""torchtitan 0.3's config registries read as a launch: `--from models/qwen3/config_registry.py::qwen3_30b_a3b`.

torchtitan 0.3 dropped its job TOMLs for Python: `run_train.sh --module qwen3 --config qwen3_30b_a3b` calls a
function of `torchtitan/models/<module>/config_registry.py` that returns a `Trainer.Config`. gplan reads that
function statically — it never imports torchtitan or runs the file — by evaluating the few forms the registries
are written in: `Trainer.Config(section=SectionConfig(key=value, …), …)`, a variable assigned once
(`model_spec = model_registry("30B-A3B")`), another registry function called and changed
(`config = qwen3_debugmodel(); config.training.seq_len = 8192`). What it cannot evaluate (a helper's result,
arithmetic) is kept as unknown: a key gplan prices that is unknown is refused naming it; any other is listed
as not read. The values come out as the job-config keys the TOML reader takes (`section.key`), with 0.3's
own defaults where the function sets nothing: per-op checkpointing (`Trainer.Config.activation_checkpoint`
is `SelectiveAC.Config`), the loss whole unless `ChunkedLossWrapper` chunks it.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gplan.engines.torchtitan import ENGINE
from gplan.errors import InputError
from gplan.launch_text import file_and_member


@dataclass
class Built:
    """A config object a registry builds: its class as written and the keywords it was given."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Unknown:
    """A value the registry computes in a way gplan does not evaluate (its source text, to say which)."""

    text: str


AC_MODES = {"FullAC": "full", "SelectiveAC": "selective", "MemoryBudgetAC": "memory_budget", "NoAC": "none"}
"""torchtitan 0.3's activation-checkpointing classes (distributed/activation_checkpoint.py) -> ≤ 0.2's
`activation_checkpoint.mode`; SelectiveAC is the per-operator policy (`selective_ac_option = "op"`)."""
MODEL_REGISTRY_KEYS = {"moe_comm_backend": "parallelism.expert_parallel_comm_backend",
                       "attn_backend": "model.attn_backend", "converters": "model.converters",
                       "non_blocking_capacity_factor": "model.non_blocking_capacity_factor"}
"""`model_registry(flavor, …)`'s keywords (models/<module>/__init__.py) -> the job-config keys the reader takes."""


def is_registry(text: str) -> bool:
    return "Trainer.Config" in text


def registry_values(path: Path) -> tuple[dict[str, Any], int]:
    """The job-config keys the registry function `path` names (`file::function`) sets, and the chunks its loss
    runs in."""
    file, member = file_and_member(path)
    tree = ast.parse(file.read_text(), str(file))
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    configs = sorted(name for name, f in functions.items() if _returns_trainer_config(f) and not name.startswith("_"))
    if member is None or member not in functions:
        said = f"no function {member!r} in it" if member else "it holds many configs"
        raise InputError(f"--from {file}: a torchtitan 0.3 config registry, {said}",
                         hint=f"name one: --from {file}::{configs[0] if configs else 'NAME'}"
                              + (f" ({', '.join(configs)})" if configs else ""))
    root = _Evaluator(functions, file).call(member)
    subclasses = {c.name for c in tree.body if isinstance(c, ast.ClassDef)
                  and any(ast.unparse(base).endswith("Trainer.Config") for base in c.bases)}
    if isinstance(root, Built) and root.kind in subclasses:  # its own Trainer.Config (its __post_init__'s checks)
        root = Built("Trainer.Config", {**root.fields, TRAINER_CLASS: root.kind})
    if not isinstance(root, Built) or not root.kind.endswith("Trainer.Config"):
        raise InputError(f"--from {path}: {member} does not return a Trainer.Config gplan can read",
                         hint="name a function of the registry that returns Trainer.Config(...)")
    return job_keys(root, path)


TRAINER_CLASS = "(trainer config class)"
"""The key job_keys hands a registry's own subclass of Trainer.Config under (its checks are not read: said)."""


def _returns_trainer_config(function: ast.FunctionDef) -> bool:
    return function.returns is not None and ast.unparse(function.returns).endswith("Trainer.Config")


def job_keys(root: Built, path: Path) -> tuple[dict[str, Any], int]:
    """A Trainer.Config as `section.key` values (model.name: the registry's module, the folder it sits in), and its
    loss's chunks."""
    module = file_and_member(path)[0].parent.name
    values: dict[str, Any] = {"activation_checkpoint.mode": "selective", "activation_checkpoint.selective_ac_option": "op"}
    chunks = 1
    for section, item in root.fields.items():
        if section == "model_spec":
            values |= _model_keys(item, module, path)
        elif section == "activation_checkpoint" and isinstance(item, Built):
            name = item.kind.removesuffix(".Config").rsplit(".", 1)[-1]
            values["activation_checkpoint.mode"] = AC_MODES.get(name, name)
            values |= {f"activation_checkpoint.{k}": v for k, v in item.fields.items()}
        elif section == "loss" and isinstance(item, Built):
            if "ChunkedLossWrapper" in item.kind:
                chunks = item.fields.get("num_chunks", ENGINE.loss_chunks)
            values |= {f"loss.{k}": v for k, v in _flat(item.fields).items()}
        elif section == "hf_assets_path":
            values["model.hf_assets_path"] = item
        elif isinstance(item, Built):
            values |= {f"{section}.{k}": v for k, v in _flat(item.fields).items()}
        else:
            values[section] = item
    return values, chunks


def _model_keys(item: Any, module: str, path: Path) -> dict[str, Any]:
    if not isinstance(item, Built) or item.kind != "model_registry":
        return {"model.name": module, "model.flavor": Unknown(str(item))}
    values = {"model.name": module, "model.flavor": item.fields.get("flavor")}
    for key, value in item.fields.items():
        if key == "flavor":
            continue
        if key not in MODEL_REGISTRY_KEYS:
            raise InputError(f"--from {path}: model_registry's {key}={value!r} is not priced by gplan",
                             hint="name a registry function without it (model_registry's flavor, attn_backend, "
                                  "moe_comm_backend, non_blocking_capacity_factor and converters are read)")
        if key == "converters" and isinstance(value, list):
            value = [c.kind.removesuffix(".Config").lower() if isinstance(c, Built) else str(c) for c in value]
        values[MODEL_REGISTRY_KEYS[key]] = value
    return values


def _flat(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, Built):
            flat |= _flat(value.fields, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class _Evaluator:
    """The registry's functions evaluated as data: calls build `Built` objects, names resolve to what the
    function assigned, and anything else is `Unknown`."""

    def __init__(self, functions: dict[str, ast.FunctionDef], file: Path):
        self.functions, self.file = functions, file

    def call(self, name: str, depth: int = 0, env: dict[str, Any] | None = None) -> Any:
        if depth > 8:
            raise InputError(f"--from {self.file}: {name} calls registry functions too deep to follow",
                             hint="pass a registry function that builds its Trainer.Config itself")
        done, result = self.run(self.functions[name].body, name, {} if env is None else env, depth)
        return result if done else Unknown(f"{name}() returns nothing gplan reads")

    def run(self, body: list[ast.stmt], name: str, env: dict[str, Any], depth: int) -> tuple[bool, Any]:
        """Statements in order: (True, the value) at a return, (False, None) at the end."""
        for statement in body:
            if isinstance(statement, ast.Return):
                return True, self.value(statement.value, env, depth)
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                self.assign(statement.targets[0], self.value(statement.value, env, depth), env)
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                self.assign(statement.target, self.value(statement.value, env, depth), env)
            elif isinstance(statement, (ast.Assert, ast.Pass)):  # checks, not changes
                continue
            elif isinstance(statement, ast.FunctionDef):  # a helper defined in place (an SFT recipe's sample
                env[statement.name] = Unknown(f"{statement.name} (a function)")  # processor): a value, not a change
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):  # a docstring
                continue
            elif isinstance(statement, ast.For) and self.loop(statement, name, env, depth):
                continue
            elif not (isinstance(statement, ast.Expr) and self.changes(statement.value, env, depth)):
                # a helper of another file, a branch, a loop over what gplan cannot list: not followed
                raise InputError(f"--from {self.file}::{name}: line {statement.lineno} "
                                 f"({ast.unparse(statement).splitlines()[0]}) changes the config in a way gplan does "
                                 "not follow", hint="name a registry function that writes its config out, or pass the "
                                                    "script that runs it with the keys overridden")
        return False, None

    def loop(self, statement: ast.For, name: str, env: dict[str, Any], depth: int) -> bool:
        """`for x in (a, b): …` over a literal list, its body run once per item (enable_fused_swiglu's overrides)."""
        items = self.value(statement.iter, env, depth)
        if not (isinstance(statement.target, ast.Name) and isinstance(items, list) and not statement.orelse):
            return False
        for item in items:
            env[statement.target.id] = item
            self.run(statement.body, name, env, depth)
        return True

    def changes(self, node: ast.expr, env: dict[str, Any], depth: int) -> bool:
        """A call that changes the config in place and that gplan follows: a function of the registry handed the
        config (`enable_fused_swiglu(config)`: its body run on it), or `config.section.key.append(value)`."""
        if not isinstance(node, ast.Call) or node.keywords:
            return False
        func = ast.unparse(node.func)
        if func in self.functions:
            params = [a.arg for a in self.functions[func].args.args]
            if len(params) != len(node.args):
                return False
            self.call(func, depth + 1, {p: self.value(a, env, depth) for p, a in zip(params, node.args)})
            return True
        if isinstance(node.func, ast.Attribute) and node.func.attr == "append" and len(node.args) == 1:
            held = self.held_list(node.func.value, env)
            if held is not None:
                held.append(self.value(node.args[0], env, depth))
                return True
        return False

    def held_list(self, target: ast.expr, env: dict[str, Any]) -> list | None:
        """The list `config.section.key` names, made empty where the config does not set it yet (torchtitan's
        defaults for the list fields gplan reads this way are empty: `override.imports`)."""
        chain = []
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if not (chain and isinstance(target, ast.Name) and isinstance(env.get(target.id), Built)):
            return None
        holder = env[target.id]
        for attr in reversed(chain[1:]):
            holder = holder.fields.setdefault(attr, Built(attr))
            if not isinstance(holder, Built):
                return None
        held = holder.fields.setdefault(chain[0], [])
        return held if isinstance(held, list) else None

    def assign(self, target: ast.expr, value: Any, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        chain = []
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if isinstance(target, ast.Name) and isinstance(env.get(target.id), Built):
            holder = env[target.id]
            for attr in reversed(chain[1:]):
                holder = holder.fields.setdefault(attr, Built(attr))
                if not isinstance(holder, Built):
                    return
            holder.fields[chain[0]] = value

    def value(self, node: ast.expr | None, env: dict[str, Any], depth: int) -> Any:
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(item, env, depth) for item in node.elts]
        if isinstance(node, ast.Name):
            return env.get(node.id, Unknown(node.id))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return -node.operand.value
        if isinstance(node, ast.Attribute):
            owner = self.value(node.value, env, depth)
            if isinstance(owner, Built) and node.attr in owner.fields:
                return owner.fields[node.attr]
            return Unknown(ast.unparse(node))
        if isinstance(node, ast.Call):
            return self.called(node, env, depth)
        return Unknown(ast.unparse(node))

    def called(self, node: ast.Call, env: dict[str, Any], depth: int) -> Any:
        func = ast.unparse(node.func)
        keywords = {k.arg: self.value(k.value, env, depth) for k in node.keywords if k.arg}
        if func in self.functions and not node.args:
            return copy.deepcopy(self.call(func, depth + 1))
        if func == "model_registry":
            flavor = self.value(node.args[0], env, depth) if node.args else keywords.get("flavor")
            return Built("model_registry", {"flavor": flavor, **keywords})
        if func.endswith("Config") or func.endswith(".Config"):
            return Built(func, keywords)
        return Unknown(ast.unparse(node))
