from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from gplan.cli import app

from gplan.profiles.catalogue import load_cluster
from gplan.profiles.catalogue import load_model
from gplan.spec.model import ModelSpec
from gplan.spec.training import TrainingSpec


@pytest.fixture
def gpt() -> ModelSpec:
    """A GPT in Korthikanti et al.'s setting: 4h gelu MLP, MHA, dropout (1-byte masks)."""
    return ModelSpec(name="gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=51200,
                     seq_length=2048, dropout=0.1, tie_embeddings=True)


@pytest.fixture
def llama8b() -> ModelSpec:
    return load_model("llama3-8b")


@pytest.fixture
def a100_cluster():
    return load_cluster("dgx-a100-80g", 64)


@pytest.fixture
def training() -> TrainingSpec:
    return TrainingSpec(gbs=64, seq_length=2048)


ONE_PROCESS_STEPS = 6
"""Steps of the single-process reference runs (the optimizer's learning rate is constant, so a shorter
run's losses are a prefix of these)."""


@pytest.fixture(scope="session")
def one_process(tmp_path_factory):
    """`one_process(model, steps)`: the losses of one process (dp = tp = pp = 1) training a tiny model, each
    model launched once a session — every multi-process layout in the backend tests must reproduce them."""
    from forked_ranks import launches_forked
    from helpers import cli_json, tiny_plan

    losses: dict[str, list[float]] = {}

    def run(model: ModelSpec, steps: int = ONE_PROCESS_STEPS) -> list[float]:
        assert steps <= ONE_PROCESS_STEPS, f"the reference runs {ONE_PROCESS_STEPS} steps"
        if model.name not in losses:
            root = tmp_path_factory.mktemp(f"one-process-{model.name}")
            with launches_forked():
                r = CliRunner().invoke(app, ["launch", str(tiny_plan(root / "plan.json", model)), "--run-dir",
                                             str(root / "run"), "--steps", str(ONE_PROCESS_STEPS), "--device", "cpu",
                                             "--json"])
            assert r.exit_code == 0, r.stderr[-3000:]
            losses[model.name] = cli_json(r.stdout)["losses"]
        return losses[model.name][:steps]

    return run


class Result:
    def __init__(self, result):
        self.code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    def json(self):
        """The command's data, its `--json` envelope checked (helpers.cli_json); a failure's whole
        document."""
        from helpers import cli_json

        return cli_json(self.stdout)


@pytest.fixture
def gplan():
    runner = CliRunner()

    def run(*args: str) -> Result:
        return Result(runner.invoke(app, list(args), catch_exceptions=False))

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With GPLAN_REQUIRE_ENGINES=1 (CI sets it), a test skipped for a missing engine fails."""
    from helpers import engine_skip_as_failure

    outcome = yield
    engine_skip_as_failure(outcome.get_result(), os.environ.get("GPLAN_REQUIRE_ENGINES") == "1")


# ---- progress a person can read: one line per test file as it finishes (with -q the dots alone sit at
# one percentage for minutes while a multi-process run trains) --------------------------------------------
_progress: dict = {}


def pytest_collection_modifyitems(session, config, items):
    import time

    per_file: dict[str, int] = {}
    for item in items:
        per_file[item.location[0]] = per_file.get(item.location[0], 0) + 1
    _progress.update(left=dict(per_file), total=dict(per_file), files=len(per_file), done=0, start=time.monotonic(),
                     file_start={})


def pytest_runtest_logstart(nodeid, location):
    import time

    _progress.get("file_start", {}).setdefault(location[0], time.monotonic())


def pytest_runtest_logfinish(nodeid, location):
    import time

    left = _progress.get("left")
    if not left or location[0] not in left:
        return
    left[location[0]] -= 1
    if left[location[0]]:
        return
    _progress["done"] += 1
    config = _progress.get("config")
    reporter = config.pluginmanager.get_plugin("terminalreporter") if config else None
    if reporter is None or reporter.verbosity > 0:
        return
    now = time.monotonic()
    took = now - _progress["file_start"].get(location[0], now)
    reporter.write("\n")
    reporter.write_line(f"  {location[0]}: {_progress['total'][location[0]]} tests in {took:.0f} s "
                        f"({_progress['done']}/{_progress['files']} files, {(now - _progress['start']) / 60:.1f} min)")


def pytest_configure(config):
    _progress["config"] = config
