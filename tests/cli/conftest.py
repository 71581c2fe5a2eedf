from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gplan.cli import app


class Result:
    def __init__(self, result):
        self.code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def gplan():
    runner = CliRunner()

    def run(*args: str) -> Result:
        return Result(runner.invoke(app, list(args), catch_exceptions=False))

    return run
