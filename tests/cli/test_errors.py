"""What used to crash with exit 1 (issue 13) is one error line with a hint and exit 3, with nothing
half-written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_plan.json"


def no_traceback(r) -> bool:
    return "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_top_zero(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--top", "0", "--out", str(tmp_path / "p.json"))
    assert r.code == 3 and "--top 0" in r.stderr and no_traceback(r)
    assert list(tmp_path.iterdir()) == []


def test_out_is_a_directory(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--out", str(tmp_path))
    assert r.code == 3 and "is a directory" in r.stderr and no_traceback(r)
    assert list(tmp_path.iterdir()) == []  # no .tmp left behind


def test_out_in_a_missing_folder(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--out", str(tmp_path / "no" / "such" / "p.json"))
    assert r.code == 3 and "cannot write" in r.stderr and no_traceback(r)
    assert not (tmp_path / "no").exists()


def test_export_into_an_existing_file(gplan, tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    r = gplan("export", str(GOLDEN), "--to", "megatron", "-o", str(target))
    assert r.code == 3 and "not a directory" in r.stderr and no_traceback(r)
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_that_is_not_utf8(gplan, tmp_path, suffix):
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"name: \xff\xfe\x00bad\n")
    r = gplan("validate", str(path))
    assert r.code == 3 and "UTF-8" in r.stderr and no_traceback(r)
    r = gplan("search", str(path), "--devices", "8", "--out", str(tmp_path / "p.json"))
    assert r.code == 3 and "UTF-8" in r.stderr


def test_a_plan_that_is_not_utf8(gplan, tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b'{"schema_version": 1, "x": "\xff"}')
    r = gplan("estimate", str(path))
    assert r.code == 3 and no_traceback(r)


def test_a_closed_pipe_is_no_internal_error(gplan, tmp_path):
    """`gplan launch … --dry-run | head -1`: the reader leaves early (the 1024 node lines overflow the
    pipe); gplan stops without a traceback."""
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    assert gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024", "--out", str(plan)).code == 0
    script = (f"{sys.executable} -m gplan.cli launch {plan} --nnodes 1024 --nproc-per-node 1 "
              f"--rdzv-endpoint n0:1 --dry-run | head -c 1")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("setting", [None, "4"])
def test_the_cli_leaves_the_blas_thread_setting_as_it_found_it(setting):
    """`main` loads numpy with one OpenBLAS thread (its pool only costs start-up here), but the processes
    gplan launches see the user's environment: the variable is unset again, or the user's value kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if setting:
        env["OPENBLAS_NUM_THREADS"] = setting
    code = ("import os, sys; from gplan import cli_base; cli_base.load_numpy_single_threaded(); "
            "print('numpy' in sys.modules, os.environ.get('OPENBLAS_NUM_THREADS'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(setting is None), str(setting)]  # a user's own setting: numpy loads as usual


@pytest.mark.parametrize("collecting", [True, False])
def test_the_cli_leaves_the_garbage_collector_as_it_found_it(collecting):
    """Importing the CLI (and `main`'s start-up) pause Python's cyclic collector while modules load; a
    program that imports gplan.cli, or the command gplan runs, gets it back as it was."""
    code = ("import gc, sys; gc.enable() if sys.argv[1] == 'True' else gc.disable(); from gplan import cli; "
            "print(gc.isenabled()); cli.app = lambda: print(gc.isenabled()); cli.main()")  # the command's view
    out = subprocess.run([sys.executable, "-c", code, str(collecting)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(collecting)] * 2


@pytest.mark.parametrize("name, kind", [("logs/megatron_gpt_13b_tp2_pp4_fp16_2021.log", "a training log"),
                                        ("torchtitan_llama3_8b.toml", "a TOML file"),
                                        ("megatron_llama3_70b_train.sh", "a launch script")])
def test_a_launch_or_log_given_as_model_says_what_it_is(gplan, name, kind):
    from pathlib import Path

    path = Path(__file__).parents[1] / "data" / name
    r = gplan("estimate", str(path), "--devices", "8", "--cluster", "dgx-h100")
    assert r.code == 3 and f"{kind}" in r.stderr and "not a model file" in r.stderr and "--from" in r.stderr
    assert "malformed YAML" not in r.stderr and "Traceback" not in r.stderr
