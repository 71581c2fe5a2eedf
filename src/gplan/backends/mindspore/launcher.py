"""Start a plan under msrun (no MindSpore import: rendering and dry runs work anywhere).

Every node runs `msrun --worker_num N --local_worker_num K --master_addr A --master_port P
--node_rank R --log_dir D --join True --cluster_time_out T worker.py …`; on Ascend the environment
names the visible NPUs and HCCL's timeouts. On CPU MindSpore runs data parallel only (its
semi-automatic parallelism and pipeline stages need Ascend or GPU), so a plan with tp or pp there is
refused before any process starts (exit 5).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path

from gplan.backends.common import worker_argv
from gplan.backends.capability import lacked_switch_notes, refuse_unsupported
from gplan.backends.protocol import JobRecipe, LaunchOptions, LaunchSpec, NodeCommand
from gplan.backends.recipes import MSRUN_PORT, job_name, msrun_argv, node_layout
from gplan.backends.slurm import slurm_script as slurm_script_of
from gplan.backends.supervisor import run_job
from gplan.backends.mindspore.device import RUNS_ON
from gplan.backends.mindspore.strategy import optimizer_parallel_note
from gplan.errors import BackendError, InputError
from gplan.plan import Plan

HCCL_TIMEOUT_S = 1800


def worker_script() -> str:
    """The worker's file (msrun runs a script, not a module); found without importing it."""
    spec = importlib.util.find_spec("gplan.backends.mindspore.worker")
    return str(Path(spec.origin)) if spec and spec.origin else "gplan/backends/mindspore/worker.py"


def check_supported(plan: Plan, device: str) -> None:
    """What MindSpore can run where (spec.targets' "mindspore"): refused before launch with the
    hardware it needs."""
    refuse_unsupported(plan, "mindspore")
    foreign = [g.hardware for g in plan.cluster.node_groups if g.hardware.kind not in RUNS_ON]
    if foreign and device != "cpu":
        raise InputError(f"the mindspore backend runs on {', '.join(RUNS_ON.values())}; this plan was priced on "
                         f"{foreign[0].name} ({foreign[0].kind})", hint="launch it with --device cpu to try it on CPUs")
    c = plan.parallel
    if _on_cpu(plan, device) and (c.tp > 1 or c.pp > 1):
        raise BackendError(f"MindSpore runs tp={c.tp} pp={c.pp} only on Ascend NPUs or GPUs; on CPU it runs data "
                           "parallel only", hint="run this plan on an Ascend (or GPU) cluster, or search with --tp 1 --pp 1")


def render(plan: Plan, plan_path: Path, options: LaunchOptions) -> LaunchSpec:
    check_supported(plan, options.device)
    if options.checkpoint_dir or options.resume:
        raise InputError("checkpoints are written by the torch backend only",
                         hint="drop --checkpoint-dir/--resume, or launch with --backend torch")
    nnodes, per_node = node_layout(plan, options)
    master, port = _endpoint(options.rdzv_endpoint)
    job = recipe(plan, plan_path, options, nnodes, per_node)
    nodes = [NodeCommand(node, msrun_argv(job, str(node), master, port, options.run_dir / "msrun_log"))
             for node in range(nnodes)]
    return LaunchSpec(plan.world_size, nnodes, per_node, nodes, env=job.env, notes=notes(plan, options.device))


def recipe(plan: Plan, plan_path: Path, options: LaunchOptions, nnodes: int, per_node: int) -> JobRecipe:
    return JobRecipe(nnodes, per_node, [worker_script(), *worker_argv(plan_path, options)], job_env(plan, per_node))


def notes(plan: Plan, device: str) -> list[str]:
    return _sharding_notes(plan, device) + lacked_switch_notes(plan, "mindspore")


def _sharding_notes(plan: Plan, device: str) -> list[str]:
    c = plan.parallel
    if c.zero == 0 or c.dp == 1:
        return []
    if _on_cpu(plan, device):
        return [f"on CPU MindSpore runs plain data parallel: zero {c.zero} is not applied (every rank keeps the "
                f"whole optimizer state)"]
    sharding = optimizer_parallel_note(c.zero)
    return [sharding] if sharding else []


def _on_cpu(plan: Plan, device: str) -> bool:
    return device == "cpu" or (device == "auto" and plan.cluster.primary.hardware.kind == "cpu")


def _endpoint(endpoint: str | None) -> tuple[str, int]:
    if not endpoint:
        return "127.0.0.1", MSRUN_PORT
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT", hint="for example node0:8118")
    return host, int(port)


def job_env(plan: Plan, per_node: int) -> dict[str, str]:
    env = {"GLOG_v": "2"}
    if plan.cluster.primary.hardware.kind == "npu":
        env.update({"ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, range(per_node))),
                    "HCCL_CONNECT_TIMEOUT": str(HCCL_TIMEOUT_S), "HCCL_EXEC_TIMEOUT": str(HCCL_TIMEOUT_S)})
    return env


def slurm_script(plan: Plan, plan_path: Path, options: LaunchOptions, header: list[str] = ()) -> str:
    """One srun task per node; each runs msrun with its node rank from SLURM_NODEID."""
    check_supported(plan, options.device)
    nnodes, per_node = node_layout(plan, replace(options, rdzv_endpoint="slurm", node_rank=0))
    job = recipe(plan, plan_path, options, nnodes, per_node)
    argv = msrun_argv(job, "$SLURM_NODEID", "$HEAD_NODE", MSRUN_PORT, options.run_dir / "msrun_log")
    npu = plan.cluster.primary.hardware.kind == "npu"
    resource = f"#SBATCH --gres=npu:{per_node}" if npu else f"#SBATCH --cpus-per-task={per_node}"
    return slurm_script_of(job_name("gplan-ms", plan), job, resource, argv, header)


def run(spec: LaunchSpec, options: LaunchOptions, echo) -> None:
    """Run this node's msrun; msrun starts the workers with the `python` of PATH, so this
    interpreter's directory goes first."""
    argv = [str(Path(sys.executable).with_name("msrun")), *spec.nodes[options.node_rank].argv[1:]]
    options.run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    code = run_job(argv, env, options.run_dir / "msrun.log")
    if code != 0:
        raise _failure(code, options.run_dir)


def _failure(code: int, run_dir: Path) -> BackendError:
    logs = run_dir / "msrun_log"
    for path in sorted(logs.glob("worker_*.log")):
        text = path.read_text(errors="replace")
        if "Traceback" in text or "FAILED" in text:
            rank = path.stem.removeprefix("worker_")
            tail = " | ".join(line for line in text.splitlines()[-4:] if line.strip())
            return BackendError(f"rank {rank} failed; the job was stopped; its last lines: {tail}",
                                hint=f"see {path} and {run_dir}/msrun.log")
    return BackendError(f"msrun failed (exit {code})", hint=f"see {logs} and {run_dir}/msrun.log")
