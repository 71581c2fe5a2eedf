"""FP8 and MXFP8 plans run by gplan's torch worker through torchao (backends/torch/apply_lowp.py), on
CPU with torchao's emulated kernels over gloo: data, tensor + sequence, pipeline parallel and FSDP2
(its float8 all-gather under the tensorwise recipe). Each run's losses stay within LOSS_TOLERANCE of
the model's run without the recipe (one process's, which every layout reproduces) — the casts quantise,
so they differ, but only a little — and the run report names the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forked_ranks import launches_forked
from gplan.cli import app
from helpers import TINY_LLAMA, TRAINING, requires_engine, tiny_plan, cli_json

pytestmark = [pytest.mark.slow, requires_engine("torch", "torch"), requires_engine("torchao", "torch")]
STEPS = 4
LOSS_TOLERANCE = 0.01
"""Relative difference allowed per step between a low-precision run and the 16-bit run of the model (the
tiny model's losses move ~2% over the steps; FP8 casts change them by ~0.1%)."""

LAYOUTS = {"dp2": dict(dp=2), "tp2_sp": dict(tp=2, sp=True), "pp2": dict(pp=2), "fsdp_dp2": dict(dp=2, zero=3)}
#: (precision, the cluster whose tensor cores price it, what the report says)
RECIPES = {"fp8": ("dgx-h100", "float8 tensorwise"), "fp8-rowwise": ("dgx-h100", "float8 rowwise"),
           "mxfp8": ("dgx-b200", "MXFP8Linear")}


def launch(plan: Path, run_dir: Path) -> dict:
    with launches_forked():  # the ranks forked from a server that imported torch and torchao once
        result = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(run_dir), "--steps", str(STEPS),
                                          "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.stderr[-3000:]
    return cli_json(result.stdout)


@pytest.fixture(scope="module")
def reference(one_process):
    """The losses without a low-precision recipe: one process's, which every layout of the model reproduces
    within 1e-5 (tests/backends/test_torch_runs.py)."""
    return one_process(TINY_LLAMA, STEPS)


@pytest.mark.parametrize("precision, layout", [("fp8", name) for name in LAYOUTS]
                         + [("fp8-rowwise", "dp2"), ("fp8-rowwise", "tp2_sp"), ("mxfp8", "fsdp_dp2"), ("mxfp8", "pp2")])
def test_low_precision_run_tracks_the_16_bit_run(reference, tmp_path, precision, layout):
    cluster, named = RECIPES[precision]
    training = TRAINING.model_copy(update={"precision": precision})
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, training=training, cluster=cluster, **LAYOUTS[layout])
    report = launch(plan, tmp_path / "run")
    assert named in report["gemm_recipe"] and "emulated on CPU" in report["gemm_recipe"]
    if layout == "fsdp_dp2" and precision == "fp8":
        assert "float8 FSDP all-gather" in report["gemm_recipe"]
    assert report["losses"] == pytest.approx(reference, rel=LOSS_TOLERANCE)
    assert report["losses"] != pytest.approx(reference, rel=1e-7), "the recipe changed nothing"


def test_a_searched_fp8_plan_launches_emulated(tmp_path):
    """`gplan search … --precision fp8 --target torch`, then `gplan launch --device cpu` scaled down: the
    plan runs on its 2 processes with torchao's tensorwise float8, within tolerance of its bf16 twin."""
    runner = CliRunner()
    plans, limits = {}, []
    for precision in ("fp8", "bf16"):  # the bf16 twin held to the fp8 plan's degrees
        path = tmp_path / f"{precision}.json"
        r = runner.invoke(app, ["search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "2", "--seq-length", "2048",
                                "--gbs", "32", "--precision",
                                precision, "--target", "torch", *limits, "--out", str(path)])
        assert r.exit_code == 0, r.stderr
        plans[precision] = path
        c = json.loads(path.read_text())["parallel"]
        limits = [f"--{k}={c[k]}" for k in ("dp", "tp", "pp", "cp", "vpp", "mbs", "zero")]
    runs = {}
    for precision, path in plans.items():
        with launches_forked():
            r = runner.invoke(app, ["launch", str(path), "--device", "cpu", "--layers", "2", "--hidden", "64",
                                    "--seq-length", "32", "--gbs", "4", "--steps", "3", "--run-dir",
                                    str(tmp_path / precision), "--json"])
        assert r.exit_code == 0, r.stderr[-2000:]
        runs[precision] = cli_json(r.stdout)
    assert runs["fp8"]["world_size"] == 2 and "float8 tensorwise" in runs["fp8"]["gemm_recipe"]
    assert runs["bf16"]["gemm_recipe"] is None
    assert runs["fp8"]["losses"] == pytest.approx(runs["bf16"]["losses"], rel=LOSS_TOLERANCE)


def test_a_gpu_without_the_format_is_refused_before_the_first_step(monkeypatch):
    import torch

    from gplan.backends.torch.apply_lowp import check_capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(RuntimeError, match=r"fp8 \(tensorwise\) needs CUDA compute capability 8.9 .*A100.* is 8.0"):
        check_capability("fp8", torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_capability("fp8-rowwise", torch.device("cuda", 0))  # Hopper runs float8
    with pytest.raises(RuntimeError, match="mxfp8 .*10.0 or newer \\(Blackwell\\)"):
        check_capability("mxfp8", torch.device("cuda", 0))
    check_capability("bf16", torch.device("cuda", 0))
    check_capability("fp8", torch.device("cpu"))  # emulated


def test_the_head_router_and_odd_shapes_stay_16_bit():
    import torch
    from torch import nn

    from gplan.backends.torch.apply_lowp import apply_low_precision
    from gplan.backends.torch.model import ModelArgs, Transformer

    with torch.device("meta"):
        model = Transformer(ModelArgs.from_spec(TINY_LLAMA, 32))
    converted = apply_low_precision(model, "fp8", emulate=True, fsdp_all_gather=False)
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert kinds.pop("output") == "Linear"
    assert set(kinds.values()) == {"Float8Linear"} and converted == len(kinds) == 7 * TINY_LLAMA.num_layers
