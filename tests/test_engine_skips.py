"""Engine tests skip naming what is missing; where engines are required (CI), such a skip fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import ENGINE_SKIP, requires_engine


def test_a_missing_engine_skips_with_the_extra_that_installs_it():
    mark = requires_engine("no_such_engine_xyz", "dev")
    assert mark.args == (True,)
    assert ENGINE_SKIP in mark.kwargs["reason"] and "pip install -e '.[dev]'" in mark.kwargs["reason"]
    assert requires_engine("json", "dev").args == (False,)
    # a dotted module whose parent package is missing skips too (find_spec imports the parent and raises)
    assert requires_engine("no_such_engine_xyz.core", "dev").args == (True,)


def _run(tmp_path, require: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_probe.py"
    test.write_text(textwrap.dedent("""
        from helpers import requires_engine

        @requires_engine("no_such_engine_xyz", "dev")
        def test_needs_it():
            pass

        import pytest

        @pytest.mark.skip(reason="needs an Ascend NPU (a device skip, not an engine skip: it stays a skip)")
        def test_other_skip():
            pass
    """))
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import pytest
        from helpers import engine_skip_as_failure

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            engine_skip_as_failure(outcome.get_result(), {require})
    """))
    tests = str(Path(__file__).parent)  # where helpers.py is, as pytest's rootdir conftest puts it on the path
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                          capture_output=True, text=True, cwd=tmp_path, env=env)


def test_required_engines_turn_the_skip_into_a_failure(tmp_path):
    relaxed = _run(tmp_path, "False")
    assert relaxed.returncode == 0 and "2 skipped" in relaxed.stdout
    strict = _run(tmp_path, "True")
    # a skipif mark acts in setup, so pytest counts the turned skip as an error: the run fails either way
    assert strict.returncode == 1 and "1 error" in strict.stdout and "1 skipped" in strict.stdout
    assert "engine test skipped where engines are required" in strict.stdout
