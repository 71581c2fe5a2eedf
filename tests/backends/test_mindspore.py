"""The MindSpore backend: strategies as data for every plan shape, msrun commands, the CPU refusal,
and a real data-parallel msrun job against one process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ASCEND_SHAPES, TINY_GPT, TINY_LLAMA, ascend_plan, requires_engine, tiny_plan

from gplan.backends.mindspore.launcher import render
from gplan.backends.mindspore.strategy import COLUMN, ROW, check_layout, device_matrix, layout
from gplan.backends.protocol import LaunchOptions
from gplan.errors import BackendError
from gplan.plan import read_plan

@pytest.mark.parametrize("name", list(ASCEND_SHAPES))
def test_strategies_split_megatrons_dims_over_the_stage_devices(name):
    plan = ascend_plan(**ASCEND_SHAPES[name])
    c = plan.parallel
    got = layout(plan)
    for role in COLUMN:
        assert got.strategies[role] == ((c.dp, 1), (c.tp, 1))  # output features of W [out, in] cut by tp
    for role in ROW:
        assert got.strategies[role] == ((c.dp, c.tp), (1, c.tp))  # the contracted features cut by tp
    assert got.strategies["embedding"] == ((c.tp, 1), (c.dp, 1))
    assert got.strategies["norm"] == (((c.dp, c.tp, 1),) if c.sp else ((c.dp, 1, 1),))
    assert got.stage_devices == c.dp * c.tp
    for role, strategy in got.strategies.items():
        product = 1
        for cut in device_matrix(role, strategy):
            product *= cut
        if role in ("norm", "residual_add") and not c.sp:
            assert product == c.dp  # repeated over the tp ranks
        else:
            assert product == got.stage_devices
    assert len(check_layout(plan)) == len(got.strategies)


def test_stage_and_recompute_of_every_layer_follow_the_uneven_split():
    got = layout(ascend_plan(**ASCEND_SHAPES["pp_uneven"]))
    assert got.layer_stage == [0] * 14 + [1] * 18
    assert got.layer_recompute == ["full"] * 14 + ["none"] * 18
    assert got.pipeline_stages == 2 and got.device_num == 8 and not got.interleave


def test_interleaved_plan_puts_chunks_round_the_stages_with_each_stages_recompute():
    plan = ascend_plan(dp=2, tp=2, pp=2, vpp=4, schedule="interleaved_1f1b",
                       stages=[[("full", 6), ("none", 10)], [("selective", 16)]])
    got = layout(plan)
    assert got.interleave
    assert got.layer_stage == ([0] * 4 + [1] * 4) * 4  # 32 layers, chunks of 32 / (2·4)
    stage0 = [r for r, stage in zip(got.layer_recompute, got.layer_stage) if stage == 0]
    assert stage0 == ["full"] * 6 + ["none"] * 10
    assert {r for r, stage in zip(got.layer_recompute, got.layer_stage) if stage == 1} == {"selective"}


SEMI_AUTO_PROBE = """
import json, sys
from pathlib import Path
import mindspore as ms
from mindspore import nn
from gplan.backends.mindspore import worker
from gplan.backends.mindspore.strategy import layout
from gplan.plan import read_plan

plan = read_plan(Path(sys.argv[1]))
plan_layout = layout(plan)
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
net = worker.build_model(plan, plan_layout, worker.WeightInit(0, lazy=True))
step = worker.semi_auto_step(net, plan_layout, nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3))
wrapped = worker.micro_batched(net, plan_layout)
print(json.dumps({
    "stages": step.get_pipeline_stages(), "interleave": step._pipeline_interleave,
    "optimizer_parallel": step._enable_parallel_optimizer, "full_batch": step._full_batch,
    "micro_batching": type(wrapped).__name__, "micro_size": getattr(wrapped, "micro_size", 1),
    "layer_stage": [block.pipeline_stage for block in net.layers],
    "full_recompute": [block._has_config_recompute for block in net.layers],
    "softmax_recompute": [bool(block.softmax.attrs.get("recompute")) for block in net.layers],
    "matmul_strategy": list(net.layers[0].wq.matmul.in_strategy),
    "lazy_parameters": all(p.has_init for p in net.trainable_params()),
}))
"""


@pytest.mark.parametrize("degrees, stages", [
    (dict(tp=2, pp=2, zero=1), [[("full", 1)], [("selective", 2), ("none", 1)]]),
    (dict(dp=2, tp=2), None),
    (dict(pp=2, vpp=2, schedule="interleaved_1f1b"), None),
])
@requires_engine("mindspore", "mindspore")
def test_semi_auto_step_is_wired_as_the_plan_says(tmp_path, degrees, stages):
    """The Ascend/GPU step cannot compile on CPU (MindSpore refuses semi-auto communication there),
    but it is built: stages, interleave, optimizer sharding, the full batch, micro-batching, every
    layer's stage and recompute, the strategies on the operators, parameters left to be drawn per slice."""
    plan = read_plan(tiny_plan(tmp_path / "plan.json", TINY_LLAMA, stages=stages, **degrees))
    want = layout(plan)
    done = subprocess.run([sys.executable, "-c", SEMI_AUTO_PROBE, str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    c = plan.parallel
    assert got["stages"] == c.pp and got["interleave"] == (c.vpp > 1)
    assert got["optimizer_parallel"] == (c.zero >= 1) and got["full_batch"]
    assert got["micro_batching"] == ("Pipeline" if c.pp > 1 else "GradAccumulation" if c.num_microbatches > 1 else "Decoder")
    assert got["micro_size"] == c.num_microbatches
    assert got["layer_stage"] == want.layer_stage
    assert got["full_recompute"] == [r == "full" for r in want.layer_recompute]
    assert got["softmax_recompute"] == [r == "selective" for r in want.layer_recompute]
    assert [tuple(cut) for cut in got["matmul_strategy"]] == list(want.strategies["attention.wq"])
    assert got["lazy_parameters"]  # each rank draws only its slices when the step compiles


def test_dry_run_prints_msrun_for_a_4_node_32_device_ascend_plan(gplan, tmp_path):
    from gplan.plan import write_plan

    path = tmp_path / "plan.json"
    write_plan(ascend_plan(dp=8, tp=4), path)
    data = gplan("launch", str(path), "--backend", "mindspore", "--dry-run", "--json", "--nnodes", "4",
                 "--nproc-per-node", "8", "--rdzv-endpoint", "10.0.0.1:8118", "--run-dir", "/runs/job").json()
    assert len(data["nodes"]) == 4
    for node in data["nodes"]:
        argv = node["argv"]
        assert argv[0] == "msrun" and "--worker_num=32" in argv and "--local_worker_num=8" in argv
        assert f"--node_rank={node['node_rank']}" in argv and "--master_addr=10.0.0.1" in argv and "--join=True" in argv
        assert argv[argv.index("--plan") + 1] == "/runs/job/plan.json"
    assert data["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "HCCL_CONNECT_TIMEOUT" in data["env"]


def test_slurm_script_for_ascend_is_valid_bash(tmp_path):
    from gplan.backends.mindspore.launcher import slurm_script

    script = slurm_script(ascend_plan(dp=8, tp=4), Path("/runs/plan.json"), LaunchOptions(run_dir=Path("/runs")))
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "--node_rank=$SLURM_NODEID" in script and "--gres=npu:8" in script


@pytest.mark.parametrize("degrees", [dict(tp=2), dict(pp=2)])
def test_tp_or_pp_on_cpu_is_refused_before_launch_with_exit_5(gplan, tmp_path, degrees):
    path = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, **degrees)
    r = gplan("launch", str(path), "--backend", "mindspore", "--run-dir", str(tmp_path / "run"))
    assert r.code == 5 and "Ascend" in r.stderr
    assert not (tmp_path / "run" / "logs").exists()
    with pytest.raises(BackendError):
        render(read_plan(path), path, LaunchOptions(run_dir=tmp_path))


def test_models_outside_the_llama_family_are_refused(gplan, tmp_path):
    path = tiny_plan(tmp_path / "plan.json", TINY_GPT, None, dp=2)
    r = gplan("launch", str(path), "--backend", "mindspore", "--dry-run")
    assert r.code == 3 and "Llama family" in r.stderr


@requires_engine("mindspore", "mindspore")
@pytest.mark.slow
def test_data_parallel_msrun_job_matches_one_process(gplan, tmp_path):
    """Tolerance 1e-5 on fp32 losses: the two workers average gradients through MindSpore's
    DistributedGradReducer, the one process sees the whole batch."""
    assert shutil.which("msrun") or Path(__import__("sys").executable).with_name("msrun").exists()
    losses = {}
    for name, degrees in {"one": dict(mbs=8), "dp2": dict(dp=2, mbs=4)}.items():
        path = tiny_plan(tmp_path / f"{name}.json", TINY_LLAMA, None, **degrees)
        r = gplan("launch", str(path), "--backend", "mindspore", "--steps", "5", "--device", "cpu",
                  "--run-dir", str(tmp_path / name), "--json")
        assert r.code == 0, r.stderr[-2000:]
        report = r.json()
        assert report["backend"] == "mindspore" and report["world_size"] == (2 if name == "dp2" else 1)
        # every rank's step times and peak memory reach the report (gathered, not rank 0's alone)
        assert [r["rank"] for r in report["ranks"]] == list(range(report["world_size"]))
        assert all(len(r["step_times_s"]) == 5 and r["peak_memory_bytes"] > 0 for r in report["ranks"])
        assert report["step_times_s"] == [max(r["step_times_s"][i] for r in report["ranks"]) for i in range(5)]
        losses[name] = report["losses"]
    assert len(losses["dp2"]) == 5
    assert losses["dp2"] == pytest.approx(losses["one"], abs=1e-5)
    assert losses["one"][-1] < losses["one"][0]


def test_launch_says_where_the_mindspore_run_differs_from_the_plan(gplan, tmp_path):
    from gplan.plan import write_plan

    ascend = tmp_path / "ascend.json"
    write_plan(ascend_plan(dp=8, tp=4, zero=1), ascend)
    data = gplan("launch", str(ascend), "--backend", "mindspore", "--dry-run", "--json", "--nnodes", "4",
                 "--nproc-per-node", "8", "--rdzv-endpoint", "10.0.0.1:8118").json()
    assert len(data["notes"]) == 1 and "as zero 3 does" in data["notes"][0]
    cpu = tiny_plan(tmp_path / "cpu.json", TINY_LLAMA, dp=2, zero=1)
    data = gplan("launch", str(cpu), "--backend", "mindspore", "--dry-run", "--json", "--nproc-per-node", "2").json()
    assert len(data["notes"]) == 1 and "zero 1 is not applied" in data["notes"][0]
    replicated = tiny_plan(tmp_path / "replicated.json", TINY_LLAMA, dp=2, zero=0)
    assert gplan("launch", str(replicated), "--backend", "mindspore", "--dry-run", "--json",
                 "--nproc-per-node", "2").json()["notes"] == []


@requires_engine("mindspore", "mindspore")
def test_the_worker_refuses_a_device_smaller_than_the_plans_before_training(monkeypatch):
    """No Ascend here: MindSpore's device query is answered as a 32 GB and a 64 GB device would answer it.
    The worker's check (backends.common.device_mismatch, the torch worker's rule) refuses the first for a
    plan priced on 64 GB 910B devices, accepts the second, and on CPU asks nothing."""
    from types import SimpleNamespace

    import mindspore as ms
    from gplan.backends.mindspore import worker

    plan = ascend_plan(dp=8, tp=4)
    planned_bytes = plan.cluster.primary.hardware.memory_bytes
    asked = []

    def on(target: str, total_bytes: float):
        context = {"device_target": target, "device_id": 0}
        monkeypatch.setattr(ms, "get_context", lambda key: context[key])
        monkeypatch.setattr(ms.hal, "get_device_properties", lambda device_id, device_target: asked.append(
            device_target) or SimpleNamespace(name="Ascend910B", total_memory=total_bytes))

    on("Ascend", 32 * 2**30)
    with pytest.raises(RuntimeError, match="rank 3 runs on Ascend910B with 32.0 GiB; the plan put it on"):
        worker.check_device(plan, 3)
    on("Ascend", planned_bytes)
    worker.check_device(plan, 3)
    on("CPU", 1)
    worker.check_device(plan, 3)
    assert asked == ["Ascend", "Ascend"]


def test_an_ascend_moe_plan_points_at_the_mindformers_export_it_was_searched_for(gplan, tmp_path):
    """Qwen3-30B-A3B searched on Atlas 910B is priced as MindFormers runs it; gplan's MindSpore worker builds
    dense models only, so the launch (MindSpore by default on Ascend) refuses it before anything starts and
    names the export — not Megatron-LM, which is no way to run it on Ascend."""
    from gplan.planner import plan as search_plan
    from gplan.planner.inputs import resolve_inputs
    from gplan.plan import write_plan

    planned = search_plan(resolve_inputs("qwen3-30b-a3b", 16, "atlas-800-910b", gbs=256)).plan
    assert planned.target == "mindformers"
    path = tmp_path / "plan.json"
    write_plan(planned, path)
    r = gplan("launch", str(path), "--dry-run", "--run-dir", str(tmp_path / "run"))
    assert r.code == 3 and "(experts)" in r.stderr
    assert r.stderr.rstrip().endswith("hint: the plan was searched for mindformers: gplan export PLAN --to mindformers")
    assert gplan("export", str(path), "--to", "mindformers", "--out-dir", str(tmp_path / "mf")).code == 0
