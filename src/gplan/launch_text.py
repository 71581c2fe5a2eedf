"""Launch files as text: the `--flag value` arguments of a shell script or argument file (and the script a
launch line runs, with its arguments), and rewriting a launch (a script's flags, a TOML job config's keys) with
only the layout changed. No engine: read by planner.launch_files (`--from`) and written by the exporters'
write-back (`--out-launch`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gplan.errors import InputError


_QUOTED_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*')\s*$", re.MULTILINE)
"""`NAME="several words"` (or single-quoted) on a line of its own."""


def arguments(text: str, positional: list[str] | None = None,
              environment: dict[str, str] | None = None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Every `--flag [value]` of the text (line continuations joined, comments dropped, bash arrays
    flattened, an array element `"--flag value"` split as its unquoted expansion splits it) and the script's
    variable assignments (and a command's environment prefix, `NGPU=8 CONFIG_FILE=… ./run_train.sh`, as
    torchtitan's own launcher is run), the values with the script's variables and arithmetic expanded; the
    branch of an `if [[ "$X" == "y" ]]` that the script's own variables rule out is skipped. Flags kept in a
    quoted string variable (`moe_options=" --num-experts 64 …"`, Pai-Megatron-Patch's scripts) are read where
    the variable is expanded into a command (`torchrun … ${moe_options}`, or a `run_cmd="…"` string run by
    `eval`), not where it is assigned. `positional`: the arguments the script was called with ($1, ${10} …);
    `environment`: variables set before it runs. A flag given twice keeps its last value, as argparse does."""
    # comments first: a backslash ending a comment continues nothing (bash ends a comment at its newline)
    uncommented = "\n".join(line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
                            for line in text.splitlines())
    joined = _join_quoted(re.sub(r"\\\n", " ", uncommented))
    variables = {**(environment or {}), **{str(i): a for i, a in enumerate(positional or [], start=1)}}
    tokens, branches = [], Branches()
    # names some branch sets to a string of flags (or to nothing): where no taken branch set them, they expand to
    # nothing, as bash expands an unset variable
    flag_strings = {m.group(1) for m in _QUOTED_ASSIGN.finditer(joined)
                    if re.search(r"(^|\s)--\w", m.group(2)) or not m.group(2)[1:-1].strip()}
    for line in joined.splitlines():
        if branches.reads(line, variables) or not branches.taken:
            continue
        arithmetic = re.match(r"\s*(?:export\s+)?([A-Za-z_]\w*)=(\$\(\(.*\)\))\s*$", line)
        assign = arithmetic or re.match(r"\s*(?:export\s+)?([A-Za-z_]\w*)=([^\s()]+)\s*$", line)
        if assign:  # NAME=8, NAME=${NAME:-8} (its default, or its value before), NAME=$((A*B))
            variables[assign.group(1)] = expand(assign.group(2).strip("\"'"), variables)
            continue
        quoted = _QUOTED_ASSIGN.match(line)
        if quoted:  # a string of several words, expanded now as bash does in double quotes (not in single ones)
            inner = quoted.group(2)[1:-1]
            unset = {name: "" for name in flag_strings if name not in variables}
            variables[quoted.group(1)] = expand(inner, {**unset, **variables}) if quoted.group(2)[0] == '"' else inner
            continue
        line = _FLAG_STRING.sub(lambda m: _flag_string(m, variables, flag_strings), line)
        try:
            words = shlex.split(_unbracket(line))
        except ValueError:
            continue
        while len(words) > 1 and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # `NGPU=4 CONFIG_FILE=x ./run_train.sh`
            name, _, env_value = words.pop(0).partition("=")
            env_value = expand(env_value, variables)
            if "$" not in env_value:  # not a command substitution's remains (`HERE=$(cd … && pwd)`)
                variables[name] = env_value
        # an array's opener (`ARGS=(`, `ARGS+=(`) and its expansion (`${ARGS[@]}`, read where it was filled) are
        # no values
        words = [w for w in words if not re.fullmatch(r"[A-Za-z_]\w*\+?=|\$\{\w+\[[@*]\]\}", w)]
        tokens.append([part for word in words for part in (word.split() if word.startswith("--") else [word])])
    found: dict[str, list[str]] = {}
    for line_tokens in tokens:  # a flag's values are on its own (joined) line: the next line's command is not one
        for i, token in enumerate(line_tokens):
            if not token.startswith("--") or len(token) < 3:
                continue
            name, sep, inline = token.partition("=")
            values = [inline] if sep else []
            for nxt in line_tokens[i + 1:]:
                if nxt.startswith("--") or sep:
                    break
                values.append(nxt)
            found[name] = [expand(v, variables) for v in values]
    return found, variables


def _join_quoted(text: str) -> str:
    """Lines joined where a double-quoted assignment runs on past them (`run_cmd="torchrun … pretrain.py` and its
    flags on the lines below, up to the closing quote), as bash reads one word across them. Only an assignment's
    string is followed across lines: a stray quote elsewhere (a heredoc's apostrophe) joins nothing."""
    lines, pending = [], None
    for line in text.splitlines():
        if pending is not None:
            pending = f"{pending} {line}"
            if _open_quote(line, '"') is None:
                lines.append(pending)
                pending = None
            continue
        if re.match(r"\s*(?:export\s+)?[A-Za-z_]\w*=\"", line) and _open_quote(line) == '"':
            pending = line
        else:
            lines.append(line)
    return "\n".join(lines + ([pending] if pending is not None else []))


def _open_quote(line: str, inside: str | None = None) -> str | None:
    """The quote still open at the end of `line` (`inside`: the one open before it), backslash escapes kept."""
    quote = inside
    for i, char in enumerate(line):
        escaped = i > 0 and line[i - 1] == "\\"
        if quote is None and char in "\"'" and not escaped:
            quote = char
        elif char == quote and (quote == "'" or not escaped):
            quote = None
    return quote


_FLAG_STRING = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def _flag_string(match: re.Match, variables: dict[str, str], flag_strings: set[str]) -> str:
    """A variable holding flags (a quoted string with `--flag`s) expanded into the command line that uses it,
    unquoted, so that its words split as bash splits them (one of `flag_strings` no taken branch set: nothing);
    any other reference left for the values' expansion."""
    name = match.group(1) or match.group(2)
    held = variables.get(name, "")
    if name in flag_strings and name not in variables:
        return ""
    return held if re.search(r"(^|\s)--\w", held) else match.group(0)


def called_script(path: Path, text: str) -> tuple[Path, list[str], dict[str, str]] | None:
    """The one script `text` runs with its arguments (`sh run_mcore_qwen3.sh dlc A3B 1 8 …`, as Pai-Megatron-Patch's
    READMEs launch its scripts; `bash`, `source` and `.` alike), found beside `path` or where the line names it:
    (the script, its positional arguments with `text`'s variables expanded, the variables `text` sets and the
    line's environment prefix). None where no such script is beside it, or the text runs several."""
    _, variables = arguments(text)
    joined = re.sub(r"\\\n", " ", text)
    calls = [m for m in (re.match(r"\s*((?:[A-Za-z_]\w*=\S+\s+)*)(?:sh|bash|source|\.)\s+(\S+\.sh)\b(.*)$", line)
                         for line in joined.splitlines() if not line.lstrip().startswith("#")) if m]
    found = [(m, c) for m in calls for c in (path.parent / m.group(2), path.parent / Path(m.group(2)).name)
             if c.is_file() and c.resolve() != path.resolve()]
    if len({c.resolve() for _, c in found}) != 1 or len(calls) != 1:
        return None
    match, script = found[0]
    try:
        words = shlex.split(match.group(3).split(" #", 1)[0])
    except ValueError:
        return None
    prefix = {k: expand(v, variables) for k, v in (w.split("=", 1) for w in match.group(1).split())}
    return script, [expand(w, variables) for w in words], {**variables, **prefix}


class Branches:
    """The `if` / `elif` / `else` / `fi` blocks a script is inside, each known taken, known not, or unknown
    (read, as before: a condition gplan cannot decide)."""

    def __init__(self):
        self.stack: list[list] = []  # per block: [this branch taken (True/False/None), an earlier branch taken]

    @property
    def taken(self) -> bool:
        return all(state is not False for state, _ in self.stack)

    def reads(self, line: str, variables: dict[str, str]) -> bool:
        """Whether `line` opens, switches or closes a block (updating the stack)."""
        words = line.strip()
        head = re.match(r"(if|elif)\s+(.*?)(?:;\s*then)?\s*$", words)
        if head and head.group(1) == "if":
            self.stack.append([condition(head.group(2), variables), False])
        elif head and self.stack:
            block = self.stack[-1]
            block[1] = block[1] or block[0] is True
            block[0] = False if block[1] else condition(head.group(2), variables)
        elif re.fullmatch(r"else", words) and self.stack:
            block = self.stack[-1]
            block[1] = block[1] or block[0] is True
            block[0] = False if block[1] else (None if block[0] is None else not block[0])
        elif re.fullmatch(r"fi", words) and self.stack:
            self.stack.pop()
        else:
            return False
        return True


def condition(text: str, variables: dict[str, str]) -> bool | None:
    """A test of `[[ "$A" == "b" ]]`, `!=`, `-z`, `-n` clauses joined by `||` and `&&` (left to right, as bash
    runs a list), with the script's variables; None where any part is something else or names an unset
    variable."""
    parts = re.split(r"\s*(\|\||&&)\s*", text.strip())
    result = None
    for i in range(0, len(parts), 2):
        clause = re.fullmatch(r"\[\[?\s*(.*?)\s*\]\]?", parts[i])
        value = clause_holds(clause.group(1), variables) if clause else None
        if value is None:
            return None
        result = value if i == 0 else (result or value) if parts[i - 1] == "||" else (result and value)
    return result


_INTEGER_TESTS = {"-eq": int.__eq__, "-ne": int.__ne__, "-gt": int.__gt__, "-ge": int.__ge__, "-lt": int.__lt__,
                  "-le": int.__le__}


def clause_holds(clause: str, variables: dict[str, str]) -> bool | None:
    """One `[[ … ]]` clause: a string comparison, an integer one (`-gt`, `-eq` …) or an emptiness test (a variable
    nothing sets is empty there, as bash expands it); None for anything else."""
    try:
        raw = shlex.split(clause) if clause else []
    except ValueError:
        return None
    if len(raw) == 2 and raw[0] in ("-z", "-n"):
        name = re.fullmatch(r"\$\{?(\w+)\}?", raw[1])
        held = variables.get(name.group(1), "") if name else expand(raw[1], variables)
        return None if "$" in held else (held == "") == (raw[0] == "-z")
    words = [expand(w, variables) for w in raw]
    if any("$" in w for w in words):
        return None
    if len(words) == 3 and words[1] in ("==", "=", "!="):
        return (words[0] == words[2]) == (words[1] != "!=")
    if len(words) == 3 and words[1] in _INTEGER_TESTS and all(re.fullmatch(r"-?\d+", w) for w in words[::2]):
        return _INTEGER_TESTS[words[1]](int(words[0]), int(words[2]))
    return None


_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")
_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")


def expand(text: str, variables: dict[str, str]) -> str:
    """`text` with the script's variables substituted as bash would (`$NAME`, `${NAME}`, `${NAME:-default}`) and
    its integer arithmetic evaluated (`$(($GPUS_PER_NODE*$NUM_NODES))`); a variable the script does not set is
    left as written (so a value that needs it is refused naming it)."""
    def variable(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name in variables:
            return variables[name]
        return match.group(2).strip("\"'") if match.group(2) is not None else match.group(0)

    def arithmetic(match: re.Match) -> str:
        expression = _VARIABLE.sub(variable, match.group(1))
        expression = re.sub(r"\b[A-Za-z_]\w*\b", lambda n: variables.get(n.group(0), n.group(0)), expression)
        result = integer_arithmetic(expression)
        return match.group(0) if result is None else str(result)

    return _VARIABLE.sub(variable, _ARITHMETIC.sub(arithmetic, text))


def integer_arithmetic(expression: str) -> int | None:
    """Bash's integer arithmetic of `expression` (+ - * / %, comparisons worth 1 or 0, one `c ? a : b`,
    parentheses, integers; / truncates), or None when it holds anything else."""
    import ast

    ternary = re.fullmatch(r"([^?:]+)\?([^?:]+):([^?:]+)", expression)
    if ternary:
        test = integer_arithmetic(ternary.group(1))
        return None if test is None else integer_arithmetic(ternary.group(2 if test else 3))
    if not re.fullmatch(r"[\d\s+\-*/%()<>=!]+", expression):
        return None
    operators = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.Mod: int.__mod__,
                 ast.FloorDiv: lambda a, b: int(a / b)}
    comparisons = {ast.Gt: int.__gt__, ast.GtE: int.__ge__, ast.Lt: int.__lt__, ast.LtE: int.__le__,
                   ast.Eq: int.__eq__, ast.NotEq: int.__ne__}

    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            return operators[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in comparisons:
            return int(comparisons[type(node.ops[0])](value(node.left), value(node.comparators[0])))
        raise ValueError(node)

    try:
        return value(ast.parse(expression.strip().replace("/", "//"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _unbracket(line: str) -> str:
    """A line with a bash array's parentheses (`ARGS=(`, `)`) blanked, those inside quotes kept: Megatron's
    `--pipeline-model-parallel-layout "Et|(tt|)*30L"` keeps its group."""
    out, quote = [], None
    for char in line:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "()":
            char = " "
        out.append(char)
    return "".join(out)


@dataclass(frozen=True)
class FlagStyle:
    """How an engine's launch line holds its layout flags (its write_back.py says)."""

    defaults: dict[str, str] = field(default_factory=dict)
    """Flags at these values are not added where the launch leaves them out."""
    multi_valued: tuple[str, ...] = ()
    """Flags that take several values (argparse `nargs="*"`), replaced with all of them."""
    anchor: str = r"--\S+"
    """The line (a regular expression of its flag) the missing flags are added after."""


def rewrite_launch(text: str, flags: dict[str, str | None], style: FlagStyle, keep: tuple[str, ...] = ()) -> str:
    """`text` with only the layout flags changed (an engine's `layout_flags`): each present flag's value
    replaced, or the flag removed with its value where the plan does not use it (but `keep` flags, which
    are only ever set); each missing one added after the launch's anchor line (`style`); every other
    line — data, tokenizer, checkpoints, schedule, logging — kept as it was."""
    missing = []
    for flag, new in flags.items():
        values = r"(?:[ \t]+(?!--)[^\s\\)]+)*" if flag in style.multi_valued else r"(?:(?:=|[ \t]+)(?!--)([^\s\\)]+))?"
        pattern = re.compile(rf"(?<![\w-]){re.escape(flag)}{values}")
        if pattern.search(text) is None:
            if new is not None and style.defaults.get(flag) != new:
                missing.append(f"{flag} {new}".rstrip())
            continue
        if new is None and flag in keep:
            continue
        if new is None:
            text = pattern.sub("", text)
        else:
            text = pattern.sub(f"{flag} {new}".rstrip(), text, count=1)
    if missing:
        anchor = re.search(rf"^([ \t]*)({style.anchor})\S*.*$", text, re.MULTILINE)
        if anchor is None:
            raise InputError("the launch has no tensor-parallel line to add the layout flags beside",
                             hint="write the launch's layout flags one per line, or use gplan export")
        indent, end = anchor.group(1), anchor.end()
        continuation = " \\" if anchor.group(0).rstrip().endswith("\\") else ""
        added = "".join(f"\n{indent}{line}{continuation}" for line in missing)
        text = text[:end] + added + text[end:]
    return re.sub(r"[ \t]+\n", "\n", re.sub(r"[ \t]{2,}\\\n", " \\\n", text))


def rewrite_toml(text: str, values: dict[str, object]) -> str:
    """A TOML job config with only `values` (`section.key` -> value) changed: each key's line replaced in its
    section, a missing key added under its section's header, a missing section appended; comments and
    every other line kept."""
    import json

    def literal(item: object) -> str:
        return "true" if item is True else "false" if item is False else json.dumps(item)

    lines = text.splitlines()
    for dotted, item in values.items():
        section, key = dotted.rsplit(".", 1)
        header = next((i for i, line in enumerate(lines) if line.strip() == f"[{section}]"), None)
        if header is None:
            lines += ["", f"[{section}]", f"{key} = {literal(item)}"]
            continue
        end = next((i for i in range(header + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        found = next((i for i in range(header + 1, end) if re.match(rf"\s*{re.escape(key)}\s*=", lines[i])), None)
        if found is None:
            lines.insert(header + 1, f"{key} = {literal(item)}")
        else:
            comment = re.search(r"\s+#.*$", lines[found])
            lines[found] = f"{key} = {literal(item)}" + (comment.group(0) if comment else "")
    return "\n".join(lines) + "\n"


def rewrite_yaml(text: str, values: dict[str, object]) -> str:
    """A YAML config with only `values` (`a.b.c` -> value, mappings only) changed, line by line so that
    comments, anchors, key order and every other key stay as they were: each key's value replaced on its
    line, a missing key added as the first child of its parent (at its children's indentation), a missing
    parent chain appended at the end. Values are written in flow style (`[1, -1]`, `true`)."""
    import json

    def literal(item: object) -> str:
        return "true" if item is True else "false" if item is False else json.dumps(item)

    lines = text.splitlines()
    for dotted, item in values.items():
        path = dotted.split(".")
        found = _yaml_key_lines(lines)
        if tuple(path) in found:
            i, indent = found[tuple(path)]
            comment = re.search(r"\s+#.*$", lines[i])
            if re.fullmatch(r"\s*[^:#]+:\s*(#.*)?", lines[i]):  # its value a block below it: replaced with the line
                del lines[i + 1:i + 1 + len(_block_below(lines[i + 1:], indent))]
            lines[i] = f"{' ' * indent}{path[-1]}: {literal(item)}" + (comment.group(0) if comment else "")
            continue
        depth = len(path) - 1
        while depth > 0 and tuple(path[:depth]) not in found:
            depth -= 1
        if depth == 0:
            lines += [f"{'  ' * k}{key}:" for k, key in enumerate(path[:-1])]
            lines.append(f"{'  ' * (len(path) - 1)}{path[-1]}: {literal(item)}")
            continue
        parent_line, parent_indent = found[tuple(path[:depth])]
        child = next((ind for p, (_, ind) in found.items() if len(p) == depth + 1 and p[:depth] == tuple(path[:depth])),
                     parent_indent + 2)
        new = [f"{' ' * (child + 2 * k)}{key}:" for k, key in enumerate(path[depth:-1])]
        new.append(f"{' ' * (child + 2 * (len(path) - 1 - depth))}{path[-1]}: {literal(item)}")
        lines[parent_line + 1:parent_line + 1] = new
    return "\n".join(lines) + "\n"


def _block_below(lines: list[str], indent: int) -> list[str]:
    """The lines of a key's block value: those indented past the key, or list items at its indentation (YAML's
    compact sequences), with the blank and comment lines among them; the trailing blank and comment lines stay."""
    block = []
    for line in lines:
        bare = line.strip()
        if not bare or bare.startswith("#"):
            block.append(line)
            continue
        ind = len(line) - len(line.lstrip())
        if ind > indent or (ind == indent and bare.startswith("- ")):
            block.append(line)
            continue
        break
    while block and (not block[-1].strip() or block[-1].strip().startswith("#")):
        block.pop()
    return block


def _yaml_key_lines(lines: list[str]) -> dict[tuple[str, ...], tuple[int, int]]:
    """Every mapping key's path -> (line index, indentation); keys inside list items are left out."""
    found: dict[tuple[str, ...], tuple[int, int]] = {}
    stack: list[tuple[int, str]] = []  # (indentation, key) of the open mappings
    in_list_at: int | None = None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if in_list_at is not None and indent > in_list_at:
            continue
        in_list_at = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stripped.startswith("- "):
            in_list_at = indent - 1 if indent else -1
            continue
        match = re.match(r"([\w.\-]+)\s*:(\s|$)", stripped)
        if not match:
            continue
        key = match.group(1)
        found[tuple(k for _, k in stack) + (key,)] = (i, indent)
        stack.append((indent, key))
    return found


def file_and_member(path: Path) -> tuple[Path, str | None]:
    """`--from FILE::MEMBER` (a function of a torchtitan 0.3 config registry) -> (FILE, MEMBER); a plain path -> (it,
    None)."""
    text = str(path)
    if "::" not in text:
        return path, None
    file, member = text.rsplit("::", 1)
    return Path(file), member
