"""The torch launcher without running anything: commands per node, the SLURM script, and the
refusals that happen before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gplan.planner.scale import scaled_plan
from gplan.backends.protocol import LaunchOptions
from gplan.backends.recipes import shell_line
from gplan.backends.torch.launcher import render, slurm_script
from gplan.errors import InputError
from gplan.plan import read_plan, write_plan

SNAPSHOTS = Path(__file__).parent / "snapshots"
RUN = Path("/runs/job")


def check_snapshot(name: str, text: str) -> None:
    """Compare with the stored snapshot (GPLAN_UPDATE_SNAPSHOTS=1 rewrites it after a deliberate change)."""
    import os

    path = SNAPSHOTS / name
    if os.environ.get("GPLAN_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def commands(spec) -> str:
    return "".join(f"# node {n.node_rank}\n{shell_line(n.argv, spec.env)}\n" for n in spec.nodes)


def test_single_node_is_standalone(plan_factory):
    plan = read_plan(plan_factory(dp=2, tp=2, pp=2, sp=True))
    spec = render(plan, RUN / "plan.json", LaunchOptions(run_dir=RUN, steps=5))
    assert spec.nnodes == 1 and spec.nproc_per_node == 8
    assert spec.nodes[0].argv[:3] == ["torchrun", "--standalone", "--nnodes"]
    check_snapshot("single_node.txt", commands(spec))


def test_two_nodes_rendezvous_on_node_zero(plan_factory):
    plan = read_plan(plan_factory(dp=2, tp=2, pp=2))
    options = LaunchOptions(run_dir=RUN, nproc_per_node=4, rdzv_endpoint="node0:29500", rdzv_id="job42",
                            checkpoint_dir=Path("/ckpt"), checkpoint_every=100, resume=True)
    spec = render(plan, RUN / "plan.json", options)
    assert [n.argv[n.argv.index("--node-rank") + 1] for n in spec.nodes] == ["0", "1"]
    check_snapshot("two_nodes.txt", commands(spec))


def test_slurm_script_runs_one_torchrun_per_node(plan_factory):
    plan = read_plan(plan_factory(dp=2, tp=2, pp=2))
    script = slurm_script(plan, RUN / "plan.json", LaunchOptions(run_dir=RUN, nproc_per_node=4, steps=100))
    assert "#SBATCH --nodes=2" in script and "--ntasks-per-node=1" in script
    assert '--rdzv-endpoint "$HEAD_NODE:29500"' in script
    check_snapshot("slurm.sh", script)


def test_argv_never_passes_through_a_shell(plan_factory, tmp_path):
    odd = tmp_path / "my plan; rm -rf ~.json"
    plan = read_plan(plan_factory(dp=2))
    spec = render(plan, odd, LaunchOptions(run_dir=tmp_path))
    assert str(odd) in spec.nodes[0].argv  # one argv element, never split or interpreted
    assert "'" in shell_line(spec.nodes[0].argv, {})


@pytest.mark.parametrize("options, message", [
    (dict(nproc_per_node=3), "needs 4 ranks"),
    (dict(nproc_per_node=2, nnodes=3), "needs 4 ranks"),
    (dict(nproc_per_node=2), "need a rendezvous"),
    (dict(nproc_per_node=2, nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "--node-rank 2"),
])
def test_layout_mismatch_is_refused(plan_factory, options, message):
    plan = read_plan(plan_factory(dp=2, pp=2))
    with pytest.raises(InputError, match=message):
        render(plan, RUN / "plan.json", LaunchOptions(run_dir=RUN, **options))


def test_cli_refuses_world_size_mismatch_and_unknown_schema_before_starting(gplan, plan_factory, tmp_path):
    path = plan_factory(dp=2)
    r = gplan("launch", str(path), "--nproc-per-node", "4", "--run-dir", str(tmp_path / "run"))
    assert r.code == 3 and "needs 2 ranks" in r.stderr
    assert not (tmp_path / "run" / "logs").exists()
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    r = gplan("launch", str(path), "--run-dir", str(tmp_path / "run"))
    assert r.code == 3 and "schema" in r.stderr


def test_dry_run_json_lists_every_node(gplan, plan_factory, tmp_path):
    path = plan_factory(dp=2, tp=2)
    data = gplan("launch", str(path), "--dry-run", "--json", "--nproc-per-node", "2", "--nnodes", "2",
                 "--rdzv-endpoint", "n0:29500", "--run-dir", str(tmp_path)).json()
    assert data["nnodes"] == 2 and len(data["nodes"]) == 2
    assert all(n["argv"][0] == "torchrun" for n in data["nodes"])


def test_scaled_plan_keeps_layout_and_proportions(plan_factory):
    plan = read_plan(plan_factory(stages=[[("full", 1)], [("none", 2), ("full", 1)]], pp=2))
    small = scaled_plan(plan, layers=6, hidden=32)
    assert small.parallel == plan.parallel
    assert [s.layer_end - s.layer_start for s in small.stages] == [2, 4]
    assert small.model.hidden_size == 32 and small.model.ffn_size == 88
    assert {c.recompute for c in small.stages[0].layers} == {"full"}
    assert small.prediction.stages[0].params < plan.prediction.stages[0].params  # priced for the smaller model


def test_scaling_that_breaks_the_layout_is_refused(plan_factory):
    plan = read_plan(plan_factory(pp=2, vpp=2))
    with pytest.raises(InputError, match="does not fit pp=2 × vpp=2"):
        scaled_plan(plan, layers=6)
    with pytest.raises(InputError, match="not divisible"):
        scaled_plan(plan, hidden=30)


TORCHRUN_OUTPUT = """
Failures:
[1]:
  time      : 2026-11-29_17:39:41
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 23915)
[2]:
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 23916)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 23914)
"""


def test_the_killed_rank_is_named_not_the_peer_that_lost_its_connection(tmp_path):
    from gplan.backends.torch.launcher import failed_rank

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.log").write_text("FAILED\nRuntimeError: Connection closed by peer\n")
    assert failed_rank(TORCHRUN_OUTPUT, tmp_path) == (1, "killed by signal 9")


def test_a_rank_raising_its_own_error_is_named(tmp_path):
    from gplan.backends.torch.launcher import failed_rank

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.log").write_text("FAILED\nRuntimeError: Connection closed by peer\n")
    (tmp_path / "logs" / "rank3.log").write_text("FAILED\nValueError: bad shard\n")
    output = "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 1)\n"
    assert failed_rank(output, tmp_path) == (3, "raised an error")


def test_unsupported_plans_are_refused_before_starting(tmp_path):
    from gplan.spec.training import TrainingSpec
    from helpers import TINY_LLAMA, tiny_plan

    path = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, TrainingSpec(gbs=1, seq_length=32, precision="fp32"),
                     pp=2)
    with pytest.raises(InputError, match=r"\(microbatches\).*at least pp=2 micro-batches"):
        render(read_plan(path), RUN / "plan.json", LaunchOptions(run_dir=RUN))


@pytest.mark.parametrize("zero, expected", [(0, "not overlapped"), (1, "zero 1 runs as zero 2"), (2, None), (3, None)])
def test_launch_says_where_the_torch_run_differs_from_the_plan(gplan, plan_factory, tmp_path, zero, expected):
    path = plan_factory(dp=2, zero=zero)
    result = gplan("launch", str(path), "--dry-run", "--json", "--nproc-per-node", "2", "--run-dir", str(tmp_path))
    notes = result.json()["notes"]
    if expected is None:
        assert notes == []
    else:
        assert len(notes) == 1 and expected in notes[0]
        assert expected in result.stderr


def test_launch_says_what_precision_it_runs(gplan, tmp_path):
    """The plan prices bf16: on CPU the worker computes in fp32; on GPUs FSDP (zero ≥ 1) keeps 16-bit
    weights with fp32 reduction, while zero 0 keeps fp32 weights under autocast — each said before it runs."""
    from gplan.spec.training import TrainingSpec
    from helpers import TINY_LLAMA, tiny_plan

    bf16 = TrainingSpec(gbs=8, seq_length=32, precision="bf16")
    path = tiny_plan(tmp_path / "cpu.json", TINY_LLAMA, None, bf16, dp=2)
    notes = gplan("launch", str(path), "--dry-run", "--json").json()["notes"]
    assert any("on CPU the worker computes in fp32" in n for n in notes)
    for zero, fp32_weights in ((0, True), (1, False)):
        plan = tiny_plan(tmp_path / f"zero{zero}.json", TINY_LLAMA, None, bf16, dp=2, zero=zero)
        notes = gplan("launch", str(plan), "--dry-run", "--json", "--device", "cuda").json()["notes"]
        assert any("stay fp32 under bf16 autocast" in n for n in notes) == fp32_weights


def test_a_rank_on_a_smaller_gpu_than_planned_is_refused_before_training(tmp_path):
    """The worker's device check (backends.common.device_mismatch): on the README's A100+V100 cluster a
    V100 node started under an A100 node's rank is named, with the node group it should have been; the
    runtime's 79.2 GiB of an "80 GB" A100 is its kind."""
    from gplan.backends.common import device_mismatch
    from gplan.planner.build import make_plan
    from gplan.profiles.catalogue import load_cluster, load_model
    from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout
    from gplan.spec.training import TrainingSpec

    cluster = load_cluster(str(Path(__file__).resolve().parents[2] / "bench" / "data" / "mixed-a100-v100.yaml"))
    model = load_model("llama3-8b")
    layouts = [StageLayout(layers=[LayerCount(kind="decoder", recompute="none", count=n)], embedding=i == 0,
                           head=i == 1, node_group=g) for i, (n, g) in enumerate([(20, 0), (12, 1)])]
    plan = make_plan(model, TrainingSpec(gbs=64, seq_length=4096, precision="fp16"), cluster, ParallelConfig(dp=32, pp=2),
                     layouts)
    assert device_mismatch(plan, 0, "NVIDIA A100-SXM4-80GB", 85.0e9) is None
    problem = device_mismatch(plan, 0, "Tesla V100-SXM2-32GB", 34.1e9)
    assert "rank 0" in problem and "a100-80g" in problem and "node group 0" in problem
    assert device_mismatch(plan, 63, "Tesla V100-SXM2-32GB", 34.1e9) is None  # stage 1 is on the V100s


def test_a_plan_searched_for_megatron_is_refused_by_torch_with_the_way_to_run_it(gplan, tmp_path):
    """Meta's 405B layout, searched for Megatron-LM (chunks of unequal size), cannot run on gplan's torch
    worker: the launch stops before anything starts and points at the export the plan was made for."""
    from helpers import meta_405b_plan

    path = tmp_path / "plan.json"
    write_plan(meta_405b_plan(), path)
    r = gplan("launch", str(path), "--dry-run", "--run-dir", str(tmp_path / "run"))
    assert r.code == 3 and "uneven_interleaved" in r.stderr and "Traceback" not in r.stderr
    assert "hint: the plan was searched for megatron: gplan export PLAN --to megatron" in r.stderr
    assert not (tmp_path / "run").exists()


def test_an_ascend_plan_launches_on_mindspore_by_default_and_torch_refuses_it(gplan, tmp_path):
    """Without --backend a plan launches on its target (MindSpore for a plan searched on Atlas 910B), said in
    a note; torch on those devices would find no CUDA and train on the host CPUs, so it is refused unless
    --device cpu asks for exactly that."""
    from helpers import ascend_plan

    path = tmp_path / "plan.json"
    planned = ascend_plan(dp=8)
    write_plan(planned, path)  # priced for no engine: the hardware decides
    data = gplan("launch", str(path), "--dry-run", "--json").json()
    assert data["nodes"][0]["argv"][0] == "msrun" and data["backend"] == "mindspore"
    human = gplan("launch", str(path), "--dry-run")
    assert "note: launching with the mindspore backend (the plan's hardware; choose with --backend)" in human.stderr
    r = gplan("launch", str(path), "--backend", "torch", "--dry-run", "--run-dir", str(tmp_path / "run"))
    assert r.code == 3 and "this plan was priced on ascend-910b" in r.stderr
    assert "hint: gplan launch PLAN --backend mindspore" in r.stderr and not (tmp_path / "run").exists()
    on_cpu = gplan("launch", str(path), "--backend", "torch", "--device", "cpu", "--dry-run", "--json")
    assert on_cpu.code == 0 and on_cpu.json()["nodes"][0]["argv"][0] == "torchrun"


def test_a_plan_launches_on_its_own_target_by_default(gplan, plan_factory):
    path = plan_factory(dp=2)
    human = gplan("launch", str(path), "--dry-run")
    assert human.code == 0 and "note: launching with the torch backend" in human.stderr
    assert gplan("launch", str(path), "--dry-run", "--json").json()["nodes"][0]["argv"][0] == "torchrun"


def test_the_targets_gplan_launches_are_its_backends():
    """spec.targets names the launchable targets for its hints (it sits below the backends); the two lists are one."""
    from gplan.backends.registry import BACKENDS
    from gplan.spec.targets import LAUNCH_BACKENDS, TARGETS

    assert set(LAUNCH_BACKENDS) == set(BACKENDS) and set(LAUNCH_BACKENDS) <= set(TARGETS)


@pytest.mark.parametrize("backend", ["torch", "mindspore"])
def test_a_hardware_kind_a_backend_does_not_declare_is_refused(backend, tmp_path):
    """Backends declare the hardware kinds they run (RUNS_ON); a kind gplan learns later (planted here as
    "tpu") is refused before anything is rendered, not run on the host CPUs."""
    from helpers import tiny_plan

    from gplan.backends.protocol import LaunchOptions
    from gplan.backends.registry import backend as backend_of
    from gplan.errors import InputError
    from gplan.plan import read_plan

    plan = read_plan(tiny_plan(tmp_path / "tiny.json", dp=2))
    group = plan.cluster.node_groups[0]
    foreign = group.model_copy(update={"hardware": group.hardware.model_copy(update={"kind": "tpu", "name": "tpu-v9"})})
    plan = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"node_groups": [foreign]})})
    with pytest.raises(InputError, match=r"priced on tpu-v9 \(tpu\)"):
        backend_of(backend).render(plan, tmp_path / "plan.json", LaunchOptions(run_dir=tmp_path))
    assert backend_of(backend).render(plan, tmp_path / "plan.json", LaunchOptions(run_dir=tmp_path, device="cpu")).nodes
