"""Real multi-process jobs: torchrun, gloo on CPU. Every layout's losses must equal a single-process
run of the same model, weights and data (fp32, atol 1e-5), step after step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest

from forked_ranks import launches_forked, ranks_tail
from helpers import requires_engine, cli_json
from typer.testing import CliRunner

from gplan.cli import app

from helpers import TINY_DEEPSEEK, TINY_GPT, TINY_LLAMA, TINY_MOE, tiny_plan

pytestmark = [pytest.mark.slow, requires_engine("torch", "torch")]
STEPS = 3
"""Three steps: the losses after one and two AdamW updates, each compared with one process's (the tensor-parallel
layouts take ~2 s a step on two CPU cores, DTensor's dispatch and eight micro-batches each)."""


def launch(plan: Path, run_dir: Path, *extra: str, torchrun: bool = False) -> dict:
    """`gplan launch` of `plan`, its ranks forked from a server that imported torch once (tests/forked_ranks.py)
    or, `torchrun`, started by torchrun as a user's launch starts them."""
    with nullcontext() if torchrun else launches_forked():
        result = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(run_dir), "--steps", str(STEPS),
                                          "--device", "cpu", "--json", *extra])
    assert result.exit_code == 0, result.stderr[-3000:] + "\n" + ranks_tail(run_dir)
    return cli_json(result.stdout)


@pytest.fixture(scope="module")
def reference(one_process):
    """Losses of one process running each tiny model (dp = tp = pp = 1)."""
    return {model.name: one_process(model, STEPS) for model in (TINY_LLAMA, TINY_GPT, TINY_MOE, TINY_DEEPSEEK)}


LAYOUTS = {
    "dp2": dict(dp=2),
    "tp2_sp": dict(tp=2, sp=True),
    "pp2_1f1b_uneven": dict(pp=2, stages=[[("none", 1)], [("none", 3)]]),
    "pp2_interleaved": dict(pp=2, vpp=2),
    "pp2_gpipe_recompute": dict(pp=2, schedule="gpipe", stages=[[("full", 2)], [("selective", 1), ("none", 1)]]),
    "zero3_dp2_recompute": dict(dp=2, zero=3, recompute="full"),
    "dp2_tp2_pp2_uneven": dict(dp=2, tp=2, pp=2, sp=True, zero=1, stages=[[("none", 1)], [("selective", 3)]]),
    # context parallelism: the backend's ring attention over load-balanced causal chunks
    "cp2": dict(cp=2),
    "dp2_cp2_tp2_sp": dict(dp=2, cp=2, tp=2, sp=True),
    "cp2_pp2_zero1_recompute": dict(dp=1, cp=2, pp=2, zero=1, stages=[[("full", 2)], [("selective", 2)]]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, tmp_path):
    degrees = dict(LAYOUTS[name])
    stages = degrees.pop("stages", None)
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, stages, **degrees)
    report = launch(plan, tmp_path / "run", torchrun=name == "dp2")
    assert report["world_size"] == (json.loads(plan.read_text())["parallel"]["dp"] * degrees.get("tp", 1)
                                    * degrees.get("pp", 1) * degrees.get("cp", 1))
    assert len(report["losses"]) == STEPS
    assert report["losses"] == pytest.approx(reference["tiny-llama"], abs=1e-5)
    assert report["losses"][-1] != report["losses"][0]


MOE_LAYOUTS = {
    "dp2_experts_replicated": dict(dp=2),          # ep 1: every rank holds all experts, edp = 2
    "ep2": dict(dp=2, ep=2),                        # each rank two experts, tokens dispatched by all-to-all
    "dp4_ep2": dict(dp=4, ep=2),                    # two ep groups, expert gradients summed over edp = 2
    "pp2_dp2_ep2": dict(dp=2, pp=2, ep=2, stages=[[("none", 1)], [("none", 2)]]),
    "cp2_ep2": dict(cp=2, ep=2),                    # the ep group spans the cp ranks: each routes its own half
    "dp2_etp2": dict(dp=2, etp=2),                  # every expert's width split over two ranks gathering their tokens
    "dp4_ep2_etp2": dict(dp=4, ep=2, etp=2),        # the expert grid ep × etp over the four dp ranks
}


@pytest.mark.parametrize("name", list(MOE_LAYOUTS))
def test_moe_layout_matches_single_process(name, reference, tmp_path):
    """Expert parallelism: the same routing, expert outputs and gradients as one process holding every
    expert (the dispatch and combine all-to-alls carry the tokens and, backwards, their gradients)."""
    degrees = dict(MOE_LAYOUTS[name])
    stages = degrees.pop("stages", None)
    plan = tiny_plan(tmp_path / "plan.json", TINY_MOE, stages, **degrees)
    report = launch(plan, tmp_path / "run", torchrun=name == "ep2")
    assert report["losses"] == pytest.approx(reference["tiny-moe"], abs=1e-5)
    assert report["losses"][-1] != report["losses"][0]


@pytest.mark.parametrize("model, degrees", [(TINY_LLAMA, dict(dp=2, tp=2, sp=True)), (TINY_MOE, dict(dp=2, ep=2))],
                         ids=["llama_dp2_tp2_sp", "moe_dp2_ep2"])
def test_per_op_recompute_matches_single_process(reference, tmp_path, model, degrees):
    """torchtitan's per-operator policy (the module op) in gplan's worker: every block replays what it did not
    keep — matmuls on alternate counts, the tp collectives, the experts — and the losses do not move."""
    plan = tiny_plan(tmp_path / "plan.json", model, None, recompute="selective", recompute_modules=("op",), **degrees)
    data = json.loads(plan.read_text())
    assert data["parallel"]["recompute_modules"] == ["op"]
    assert {c["recompute"] for s in data["stages"] for c in s["layers"]} == {"selective"}
    assert launch(plan, tmp_path / "run")["losses"] == pytest.approx(reference[model.name], abs=1e-5)


def test_the_per_op_policy_replays_every_second_matmul_of_a_block():
    """Matmuls a block's backward runs: 14 for its 7 weights' gradients (wq wk wv wo w1 w3 w2: input and weight
    gradient each); full recompute replays the forward's up to the last one whose output the backward needs
    (6: torch's checkpoint stops before w2); the per-op policy only the 2nd, 4th, 6th (wk, wo, w3) — the
    others' outputs and attention's are kept."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    from gplan.backends.torch.model import ModelArgs, Transformer, per_op_contexts, rope_tables

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    args = ModelArgs.from_spec(TINY_LLAMA, 64)
    block = Transformer(args).layers["0"]
    rope = rope_tables(64, args.rope_dim, args.rope_theta, "cpu")

    def backward_matmuls(forward) -> int:
        x = torch.randn(2, 64, TINY_LLAMA.hidden_size, requires_grad=True)
        loss = forward(x).sum()
        with Matmuls() as seen:
            loss.backward()
        return seen.count

    none = backward_matmuls(lambda x: block._forward(x, rope))
    full = backward_matmuls(lambda x: checkpoint(block._forward, x, rope, use_reentrant=False))
    per_op = backward_matmuls(lambda x: checkpoint(block._forward, x, rope, use_reentrant=False,
                                                   context_fn=per_op_contexts))
    assert (none, full - none, per_op - none) == (14, 6, 3)


def test_latent_attention_and_sigmoid_routing_with_ep_and_pp_match_single_process(reference, tmp_path):
    plan = tiny_plan(tmp_path / "plan.json", TINY_DEEPSEEK, [[("selective", 2)], [("full", 1)]], dp=2, pp=2, ep=2)
    report = launch(plan, tmp_path / "run")
    assert report["losses"] == pytest.approx(reference["tiny-deepseek"], abs=1e-5)
    assert reference["tiny-deepseek"] != pytest.approx(reference["tiny-moe"], abs=1e-3)


def test_tied_gpt_with_tp_sp_and_zero_matches_single_process(reference, tmp_path):
    plan = tiny_plan(tmp_path / "plan.json", TINY_GPT, None, dp=2, tp=2, sp=True, zero=1)
    assert launch(plan, tmp_path / "run")["losses"] == pytest.approx(reference["tiny-gpt"], abs=1e-5)


@pytest.mark.parametrize("degrees", [dict(pp=2), dict(dp=2, pp=2, zero=1), dict(tp=2, pp=2, sp=True)],
                         ids=["pp2", "dp2_pp2_zero1", "tp2_pp2_sp"])
def test_tied_gpt_across_pipeline_stages_matches_single_process(reference, tmp_path, degrees):
    """The head on the last stage keeps a copy of the embedding, initialised alike; their gradients are
    summed over the first and last stage after every backward (Megatron's embedding group)."""
    plan = tiny_plan(tmp_path / "plan.json", TINY_GPT, None, **degrees)
    assert launch(plan, tmp_path / "run")["losses"] == pytest.approx(reference["tiny-gpt"], abs=1e-5)


def test_learned_positions_and_a_tied_head_with_context_parallelism(reference, tmp_path):
    """Every cp rank's tokens keep their global positions (learned position embeddings, the causal mask)."""
    plan = tiny_plan(tmp_path / "plan.json", TINY_GPT, None, cp=2, pp=2)
    assert launch(plan, tmp_path / "run")["losses"] == pytest.approx(reference["tiny-gpt"], abs=1e-5)


def test_run_report_has_every_rank_and_the_prediction(tmp_path):
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, dp=2, pp=2)
    report = launch(plan, tmp_path / "run")
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
    assert {r["stage"] for r in report["ranks"]} == {0, 1}
    assert all(len(r["step_times_s"]) == STEPS and r["peak_memory_bytes"] > 0 for r in report["ranks"])
    assert report["predicted_step_time_s"] == json.loads(plan.read_text())["prediction"]["step_time_s"]
    assert report["tokens_per_s"] == pytest.approx(8 * 32 / report["step_time_s"])


def test_resume_continues_the_same_loss_curve(tmp_path):
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, dp=2, pp=2, zero=1)
    with launches_forked():
        whole = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(tmp_path / "whole"), "--steps", "6",
                                         "--device", "cpu", "--json"])
        first = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(tmp_path / "a"), "--steps", "3",
                                         "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                         "--checkpoint-every", "3", "--json"])
        second = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(tmp_path / "b"), "--steps", "6",
                                          "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume",
                                          "--json"])
    assert whole.exit_code == first.exit_code == second.exit_code == 0
    resumed = cli_json(second.stdout)
    assert resumed["first_step"] == 3
    assert cli_json(first.stdout)["losses"] + resumed["losses"] == cli_json(whole.stdout)["losses"]


def test_a_killed_rank_ends_the_job_with_exit_5_and_keeps_the_checkpoint(tmp_path):
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, dp=2, pp=2)
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    job = subprocess.Popen([sys.executable, "-m", "gplan.cli", "launch", str(plan), "--run-dir", str(run),
                            "--steps", "100000", "--device", "cpu", "--checkpoint-dir", str(ckpt),
                            "--checkpoint-every", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim_log = run / "logs" / "rank1.log"
    deadline = time.monotonic() + 120
    while not (victim_log.exists() and "checkpoint" in victim_log.read_text() and "step 3/" in victim_log.read_text()):
        assert job.poll() is None and time.monotonic() < deadline, "the job did not reach step 3"
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in (run / "logs").glob("rank*.pid")]
    killed_at = time.monotonic()
    os.kill(int((run / "logs" / "rank1.pid").read_text()), signal.SIGKILL)
    _, stderr = job.communicate(timeout=60)
    assert time.monotonic() - killed_at < 60
    assert job.returncode == 5, stderr[-3000:]
    assert "rank 1 failed" in stderr and "signal 9" in stderr
    time.sleep(0.5)
    assert not [pid for pid in pids if _alive(pid)], "a worker outlived the job"
    steps_done = max(int(p.name.removeprefix("step_")) for p in ckpt.glob("step_*"))
    resumed = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(tmp_path / "again"), "--device", "cpu",
                                       "--checkpoint-dir", str(ckpt), "--resume", "--json",
                                       "--steps", str(steps_done + 1)])
    assert resumed.exit_code == 0, resumed.stderr[-2000:]
    assert cli_json(resumed.stdout)["first_step"] == steps_done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def test_validate_a_1024_device_plan_on_cpu(gplan, tmp_path):
    out = tmp_path / "plan.json"
    assert gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024", "--out", str(out)).code == 0
    r = gplan("launch", str(out), "--validate", "--json")
    assert r.code == 0, r.stderr
    report = r.json()
    params = [c for c in report["checks"] if c["subject"].endswith("parameters after tp")]
    assert report["ok"] and report["backend"] == "torch"
    assert len(params) == json.loads(out.read_text())["parallel"]["pp"]
    assert all(abs(c["error"]) < 0.02 and c["ok"] for c in params)


def test_validate_a_1024_device_moe_plan_with_expert_parallelism(gplan, tmp_path):
    """deepseek-v3 on 1024 ranks: every stage's rank holds the parameters the plan prices — latent
    attention, dense leading layers, routed experts after ep (the plan counts DeepSeek's per-expert
    routing bias, which the worker leaves out: 256 per MoE layer)."""
    out = tmp_path / "plan.json"
    r = gplan("search", "deepseek-v3", "--cluster", "dgx-h100", "--devices", "1024", "--gbs", "8192",
              "--seq-length", "4096", "--target", "torch", "--out", str(out))
    assert r.code == 0, r.stderr
    parallel = json.loads(out.read_text())["parallel"]
    assert parallel["ep"] > 1
    report = gplan("launch", str(out), "--validate", "--json").json()
    params = [c for c in report["checks"] if c["subject"].endswith("parameters after tp")]
    assert report["ok"] and len(params) == parallel["pp"]
    assert all(abs(c["error"]) < 1e-5 for c in params)


def test_token_file_feeds_every_layout_the_same_batches(reference, tmp_path):
    import numpy as np

    tokens = tmp_path / "tokens.bin"
    np.arange(5000, dtype=np.uint16).__mod__(256).astype(np.uint16).tofile(tokens)
    single = launch(tiny_plan(tmp_path / "one.json", TINY_LLAMA), tmp_path / "one", "--data", str(tokens))
    split = launch(tiny_plan(tmp_path / "two.json", TINY_LLAMA, None, dp=2), tmp_path / "two", "--data", str(tokens))
    assert split["losses"] == pytest.approx(single["losses"], abs=1e-5)
    assert single["losses"] != pytest.approx(reference[TINY_LLAMA.name], abs=1e-3)  # not the synthetic batches


def test_two_nodes_keep_their_node_ranks_and_match_single_process(reference, tmp_path):
    """Two `gplan launch --node-rank` processes on this host, one rank each: the static rendezvous keeps
    each node's rank (c10d would number them by host name and ignore --node-rank), so node 1 runs the
    plan's rank 1 — here the last pipeline stage — and the losses equal one process's."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, pp=2)
    procs = [subprocess.Popen([sys.executable, "-m", "gplan.cli", "launch", str(plan), "--run-dir",
                               str(tmp_path / f"node{r}"), "--steps", str(STEPS), "--device", "cpu", "--nnodes", "2",
                               "--nproc-per-node", "1", "--node-rank", str(r), "--rdzv-endpoint", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (1, 0)]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    assert {p.name for p in (tmp_path / "node1" / "logs").glob("rank*.log")} == {"rank1.log"}
    assert {p.name for p in (tmp_path / "node0" / "logs").glob("rank*.log")} == {"rank0.log"}
    report = json.loads((tmp_path / "node0" / "run_report.json").read_text())
    assert report["losses"] == pytest.approx(reference[TINY_LLAMA.name], abs=1e-5)


def test_validate_a_moe_plan_with_expert_tensor_parallelism(gplan, tmp_path):
    """qwen3-30b-a3b with ep 4 × etp 2: every stage's rank holds its experts' width slice as the plan
    prices it."""
    out = tmp_path / "plan.json"
    r = gplan("search", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--target", "torch",
              "--ep", "4", "--etp", "2", "--out", str(out))
    assert r.code == 0, r.stderr
    parallel = json.loads(out.read_text())["parallel"]
    assert (parallel["ep"], parallel["etp"]) == (4, 2)
    report = gplan("launch", str(out), "--validate", "--json").json()
    params = [c for c in report["checks"] if c["subject"].endswith("parameters after tp")]
    assert report["ok"] and len(params) == parallel["pp"] and all(abs(c["error"]) < 1e-5 for c in params)
