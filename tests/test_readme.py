"""The README a new user reads in ten minutes: short, and every command it shows is one gplan takes —
each `gplan …` line of its examples parsed by gplan's own command line (an option that was renamed or
dropped fails here), the ones that need nothing but a bundled model run whole."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from gplan.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def commands() -> list[str]:
    """Every `gplan …` line inside the README's ```bash blocks (comments dropped), synopsis lines (with
    `[`, `|` or `...`) left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("# "):
                continue
            for part in re.split(r"\s*&&\s*", line):
                if part.startswith("gplan ") and not re.search(r"\[|\||\.\.\.|…", part):
                    found.append(part)
    return found


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 450


def test_the_readme_shows_commands():
    assert len(commands()) >= 25


@pytest.mark.parametrize("line", commands())
def test_every_readme_command_parses(line):
    group = typer.main.get_command(app)
    words = shlex.split(line)[1:]
    command = group.get_command(click.Context(group), words[0])
    assert command is not None, f"no command {words[0]}"
    command.make_context(words[0], words[1:])  # an unknown option or a missing argument raises


RUNNABLE = [line for line in commands() if re.match(r"gplan (search|estimate|compare) [a-z0-9.-]+ ", line)
            and "--from" not in line and "--hardware bench" not in line and ".json" not in line.split()[2]]


@pytest.mark.parametrize("line", RUNNABLE)
def test_readme_commands_on_bundled_models_run(gplan, tmp_path, monkeypatch, line):
    monkeypatch.chdir(tmp_path)  # what a command writes (cpu-plan.json, report.html) stays out of the checkout
    words = shlex.split(line)[1:]
    if words[0] == "search" and "--out" not in words:
        words += ["--out", str(tmp_path / "plan.json")]
    r = gplan(*words)
    assert r.code == 0, r.stderr
