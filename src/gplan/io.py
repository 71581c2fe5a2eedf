"""File input and output shared by every layer: one atomic writer, one reader of YAML/JSON files,
one validator that turns a pydantic error into a single line with a hint.

A file gplan writes is either complete or absent: the text goes to a hidden temporary file beside the
target and is renamed over it (`os.replace` is atomic on POSIX), so an interrupted write never leaves
a half-written plan, profile or report, and a failed write leaves no temporary file behind.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any, TypeVar


from gplan.errors import InputError

M = TypeVar("M")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically; an unwritable target is an InputError (exit 3)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a directory", hint="name a file, e.g. plan.json")
    # One temporary name per process: two writers of the same file never rename each other's away.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc.strerror or exc}", hint="choose a writable path") from None


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, with libyaml's parser where PyYAML was built with it (the wheels are): the same
    safe subset, 10× faster on the bundled catalogues than the pure-Python one. (PyYAML and pydantic are
    imported on use here: the command line's help needs neither.)"""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def read_data_file(path: Path) -> Any:
    """Read YAML (or JSON, a subset) with a one-line error on a missing, unreadable or malformed file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="check the path, or use a bundled name (gplan models)")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            return json.loads(text)
        return load_yaml(text)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})", hint="save the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}", hint="fix the JSON syntax") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise InputError(f"{where}: malformed YAML: {problem}", hint="fix the YAML syntax") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}", hint="check the file's permissions") from None


#: Keys gplan knows it does not model yet; a clearer message than "unknown key".
UNSUPPORTED_KEYS = {
    "moe_layer_freq": "MoE layers between dense ones are not modelled: dense layers come first (first_dense_layers)",
}


def validate_as(model_cls: type[M], data: Any, source: str) -> M:
    """Validate `data` as `model_cls`; turn the first pydantic error into one clear line."""
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of keys to values, got {type(data).__name__}",
                         hint="the file must be a YAML/JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise _input_error(exc, model_cls, source) from exc


def _input_error(exc, model_cls, source: str) -> InputError:
    # A typo'd key explains the "missing" error it causes: report it first.
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = ".".join(str(part) for part in err["loc"])
    kind = err["type"]
    known = list(model_cls.model_fields)
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        if key in UNSUPPORTED_KEYS:
            return InputError(f"{source}: '{key}': {UNSUPPORTED_KEYS[key]}", hint=f"remove '{key}'")
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        return InputError(f"{source}: unknown key '{loc}'", hint=hint)
    if kind == "missing":
        return InputError(f"{source}: missing required key '{loc}'", hint=f"add '{loc}: <value>'")
    message = err["msg"].removeprefix("Value error, ")
    if not loc:
        return InputError(f"{source}: {message}", hint="correct the file; `gplan validate FILE` checks it again")
    return InputError(f"{source}: '{loc}': {message}", hint=f"{model_cls.__name__} keys: {', '.join(known)}")


def drop_defaults(data: dict, optional: dict[str, object]) -> dict:
    """`data` without the `optional` fields that hold their default: the canonical form a digest hashes,
    so that fields added after a file format was first written leave old files' digests as they were."""
    return {k: v for k, v in data.items() if not (k in optional and v == optional[k])}
