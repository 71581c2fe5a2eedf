"""Start a plan under torchrun (no torch import here: rendering and dry runs work anywhere).

`render` turns a plan and options into argv lists and environment — never a shell string. One node:
`torchrun --standalone --nproc-per-node K`. Several: every node runs `torchrun --nnodes N
--node-rank R --rdzv-backend static --rdzv-endpoint HOST:PORT` (static: node R gets the plan's ranks
R·K…, as placed), or one SLURM batch script starts them all (`srun` one task per node, c10d). `run` starts this node's command, streams its
output, and when a rank fails names it with its last log lines (exit 5); every process it started
is gone when it returns.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import replace
from pathlib import Path

from gplan.backends.common import worker_argv as common_worker_argv
from gplan.backends.capability import lacked_switch_notes, refuse_unsupported
from gplan.backends.protocol import JobRecipe, LaunchOptions, LaunchSpec, NodeCommand
from gplan.backends.recipes import TORCHRUN_PORT, job_name, node_layout, torchrun_argv
from gplan.backends.supervisor import run_job
from gplan.backends.slurm import hetero_slurm_script, slurm_script as slurm_script_of
from gplan.errors import BackendError, InputError
from gplan.plan import Plan
from gplan.spec.training import LOW_PRECISION_RECIPES

WORKER_MODULE = "gplan.backends.torch.worker"


def check_supported(plan: Plan) -> None:
    """What the torch worker cannot run (spec.targets' "torch"), refused before any process starts."""
    refuse_unsupported(plan, "torch")


RUNS_ON = {"gpu": "NVIDIA GPUs (NCCL)", "cpu": "CPUs (gloo)"}
"""The hardware kinds (profiles.schema.HardwareSpec.kind) the torch worker runs, declared: any other kind
is refused, so a kind gplan learns later never falls through to the host CPUs."""
KIND_NAMES = {"npu": "Ascend"}


def check_hardware(plan: Plan, device: str, what: str = "the torch backend",
                   hint: str = "gplan launch PLAN --backend mindspore (or --device cpu to try it on CPUs)") -> None:
    """Refuse a plan priced on hardware the torch worker does not run (RUNS_ON): there `--device auto` would
    find no CUDA and train on the host CPUs, so it runs only where `--device cpu` asks for that (`what` runs
    the worker: the launch, or a SLURM or Kubernetes export)."""
    foreign = [g.hardware for g in plan.cluster.node_groups if g.hardware.kind not in RUNS_ON]
    if foreign and device != "cpu":
        hw = foreign[0]
        raise InputError(f"{what} runs gplan's torch worker on {' and '.join(RUNS_ON.values())}; this plan was "
                         f"priced on {hw.name} ({KIND_NAMES.get(hw.kind, hw.kind)})", hint=hint)


def worker_args(plan_path: Path, options: LaunchOptions) -> list[str]:
    args = ["-m", WORKER_MODULE, *common_worker_argv(plan_path, options)]
    if options.checkpoint_dir:
        args += ["--checkpoint-dir", str(options.checkpoint_dir), "--checkpoint-every", str(options.checkpoint_every)]
    if options.resume:
        args.append("--resume")
    if options.resume_from:
        args += ["--resume-from", str(options.resume_from)]
    return args


def recipe(plan: Plan, plan_path: Path, options: LaunchOptions, nnodes: int, per_node: int) -> JobRecipe:
    return JobRecipe(nnodes, per_node, worker_args(plan_path, options), job_env(plan))


def render(plan: Plan, plan_path: Path, options: LaunchOptions) -> LaunchSpec:
    """The command of every node. Single node: --standalone; else c10d rendezvous."""
    check_supported(plan)
    check_hardware(plan, options.device)
    nnodes, per_node = node_layout(plan, options)
    job = recipe(plan, plan_path, options, nnodes, per_node)
    nodes = [NodeCommand(node, torchrun_argv(job, **({} if nnodes == 1 else dict(
        node_rank=str(node), endpoint=options.rdzv_endpoint, rdzv_id=options.rdzv_id)))) for node in range(nnodes)]
    return LaunchSpec(plan.world_size, nnodes, per_node, nodes, env=job.env, notes=notes(plan, options.device))


def notes(plan: Plan, device: str = "auto") -> list[str]:
    c = plan.parallel
    found = []
    cpu = device == "cpu" or (device == "auto" and plan.cluster.primary.hardware.kind == "cpu")
    if cpu and plan.training.precision != "fp32":
        found.append(f"on CPU the worker computes in fp32: the plan priced {plan.training.precision} (2-byte weights "
                     "and messages), so measured memory and message sizes are larger than predicted")
    recipe = LOW_PRECISION_RECIPES.get(plan.training.precision)
    if cpu and recipe:
        found.append(f"{plan.training.precision}: torchao's {recipe} casts run emulated "
                     "on CPU (the same quantisation, computed in software), not at the speed the plan priced")
    elif not cpu and plan.training.precision != "fp32" and not (c.zero >= 1 and c.dp * c.cp > 1):
        found.append(f"without FSDP (zero 0) the weights stay fp32 under {plan.training.precision} autocast: "
                     "4-byte weights and gradients where the plan priced 2-byte weights")
    if c.zero == 1 and c.dp > 1:
        found.append("FSDP2 cannot shard the optimizer state alone: zero 1 runs as zero 2 (gradients sharded "
                     "too), less memory than planned, a reduce-scatter in place of the all-reduce")
    if c.zero == 0 and c.dp > 1:
        found.append("zero 0 averages the gradients after the backward, not overlapped with it as DDP does: "
                     "the data-parallel all-reduce shows in full in the measured step")
    return found + lacked_switch_notes(plan, "torch")


def job_env(plan: Plan) -> dict[str, str]:
    """NCCL reports a failed peer instead of hanging; one intra-op thread per rank on CPU."""
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "GPLAN_PG_TIMEOUT_S": "300"}
    if plan.cluster.primary.hardware.kind == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    return env


def slurm_script(plan: Plan, plan_path: Path, options: LaunchOptions, header: list[str] = ()) -> str:
    """A batch script: one `srun` task per node, each running torchrun with c10d rendezvous on the
    first node of the allocation."""
    nnodes, per_node = node_layout(plan, replace(options, rdzv_endpoint="slurm", node_rank=0))
    job = recipe(plan, plan_path, options, nnodes, per_node)

    def resource(group: int) -> str:
        gpu = plan.cluster.node_groups[group].hardware.kind == "gpu"
        return f"#SBATCH --gpus-per-node={per_node}" if gpu else f"#SBATCH --cpus-per-task={per_node}"

    if len({s.node_group for s in plan.stages}) > 1:  # each node rank on a node of its stage's group
        argv = torchrun_argv(job, node_rank="$NODE_RANK", endpoint=f"$HEAD_NODE:{TORCHRUN_PORT}")
        return hetero_slurm_script(job_name("gplan", plan), job, plan, resource, argv, header)
    argv = torchrun_argv(job, endpoint=f"$HEAD_NODE:{TORCHRUN_PORT}", rdzv_id="$SLURM_JOB_ID")
    return slurm_script_of(job_name("gplan", plan), job, resource(plan.stages[0].node_group), argv, header)


# ---- running -------------------------------------------------------------------------------------

def run(spec: LaunchSpec, options: LaunchOptions, echo) -> None:
    """Run this node's command; raise BackendError naming the failed rank when the job fails."""
    argv = [sys.executable, "-m", "torch.distributed.run"] + spec.nodes[options.node_rank].argv[1:]
    options.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = options.run_dir / "torchrun.log"
    code = run_job(argv, {**os.environ, **spec.env}, log_path, echo)
    if code != 0:
        raise _failure(code, log_path.read_text(), options.run_dir)


PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout",
             "NCCL communicator was aborted")
"""Errors a rank raises because another rank died: symptoms, not the cause."""


def failures(torchrun_output: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every failed rank torchrun lists; a negative code is the signal."""
    found = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", torchrun_output)
    return list(dict.fromkeys((int(rank), int(code)) for rank, code in found))


def failed_rank(torchrun_output: str, run_dir: Path) -> tuple[int, str] | None:
    """The rank that caused the failure, and how it failed. A rank killed by a signal other than the
    SIGTERM torchrun sends to the survivors comes first; then a rank that raised an error of its own
    (not the lost connection every peer of a dead rank reports); then torchrun's first failure."""
    listed = failures(torchrun_output)
    for rank, code in listed:
        if code < 0 and -code != signal.SIGTERM:
            return rank, f"killed by signal {-code}"
    raised = []
    for path in sorted((run_dir / "logs").glob("rank*.log"), key=lambda p: int(p.stem.removeprefix("rank"))):
        text = path.read_text()
        if "FAILED" in text:
            rank = int(path.stem.removeprefix("rank"))
            raised.append((rank, any(symptom in text for symptom in PEER_LOSS)))
    for rank, symptom in raised:
        if not symptom:
            return rank, "raised an error"
    if listed:
        rank, code = listed[0]
        return rank, f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
    return (raised[0][0], "raised an error") if raised else None


def last_lines(run_dir: Path, rank: int, count: int = 8) -> list[str]:
    path = run_dir / "logs" / f"rank{rank}.log"
    if not path.is_file():
        return []
    return path.read_text().splitlines()[-count:]


def _failure(code: int, output: str, run_dir: Path) -> BackendError:
    found = failed_rank(output, run_dir)
    if found is None:
        return BackendError(f"the job failed (torchrun exit {code})", hint=f"see {run_dir}/torchrun.log")
    rank, how = found
    tail = " | ".join(last_lines(run_dir, rank))
    error = BackendError(f"rank {rank} failed ({how}); the job was stopped" + (f"; its last lines: {tail}" if tail else ""),
                         hint=f"see {run_dir}/logs/rank{rank}.log and {run_dir}/torchrun.log")
    error.failed_rank = rank  # `gplan launch --elastic` re-plans without it
    return error
