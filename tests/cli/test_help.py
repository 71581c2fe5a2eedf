"""Help is written before anything heavy loads: `gplan`, `gplan --help` and `gplan COMMAND --help` answer from
click's formatter over the commands typer builds, without parsing (typer's parse builds a pydantic adapter per
option) and without numpy — the start-up a person waits for when they ask what a command takes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from gplan import cli

COMMANDS = [c.name or c.callback.__name__ for c in cli.app.registered_commands]

RUN_HELP = ("import sys; sys.argv = ['gplan'] + sys.argv[1:]; from gplan.cli import main; main(); "
            "sys.stderr.write(' '.join(m for m in ('pydantic', 'numpy', 'rich.markdown') if m in sys.modules))")


def help_of(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN_HELP, *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_commands_help_lists_every_option_and_loads_nothing_heavy(command):
    done = help_of(command, "--help")
    assert done.returncode == 0 and done.stderr == ""  # neither pydantic, numpy nor rich's markdown loaded
    group = typer.main.get_command(cli.app)
    built = group.get_command(group.context_class(group), command)
    for param in built.params:
        if getattr(param, "hidden", False):  # a retired option kept to say where it went (explain --svg)
            continue
        names = [n for n in param.opts if n.startswith("--")] or [param.metavar or param.name]
        assert any(n in done.stdout for n in names), (command, param.name)
    assert f"Usage: gplan {command}" in done.stdout


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_the_root_help_lists_every_command(argv):
    done = help_of(*argv)
    assert done.returncode == 0 and done.stderr == ""
    assert all(f"  {name} " in done.stdout for name in COMMANDS)


def test_help_for_a_command_that_does_not_exist_is_typers_usage_error():
    done = help_of("nosuch", "--help")
    assert done.returncode == 2 and "No such command 'nosuch'" in done.stderr
