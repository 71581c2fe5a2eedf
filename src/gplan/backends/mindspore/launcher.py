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
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from gplan.backends.common import worker_argv
from gplan.backends.mindspore.strategy import optimizer_parallel_note
from gplan.backends.torch.launcher import LaunchOptions, LaunchSpec, NodeCommand, node_layout
from gplan.errors import BackendError, InputError
from gplan.plan import Plan

DEFAULT_PORT = 8118
"""msrun's default scheduler port."""
CLUSTER_TIME_OUT_S = 300
HCCL_TIMEOUT_S = 1800


def worker_script() -> str:
    """The worker's file (msrun runs a script, not a module); found without importing it."""
    spec = importlib.util.find_spec("gplan.backends.mindspore.worker")
    return str(Path(spec.origin)) if spec and spec.origin else "gplan/backends/mindspore/worker.py"


def check_supported(plan: Plan, device: str) -> None:
    """What MindSpore can run where: refused before launch with the hardware it needs."""
    c = plan.parallel
    if c.cp > 1 or c.ep > 1:
        raise InputError(f"the MindSpore backend runs dp, tp (+sp), pp and zero; this plan has cp={c.cp} ep={c.ep}",
                         hint="search again with --cp 1")
    m = plan.model
    if m.num_encoder_layers or (m.ffn_kind, m.norm, m.position_embedding, m.tie_embeddings) != ("swiglu", "rmsnorm", "rope", False):
        raise InputError(f"the MindSpore worker runs the Llama family (swiglu, RMSNorm, RoPE, untied head); {m.name} is "
                         f"{m.ffn_kind}/{m.norm}/{m.position_embedding}{'/tied' if m.tie_embeddings else ''}",
                         hint="run it with --backend torch, or export it to MindFormers")
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
    nodes = [NodeCommand(node, msrun_argv(plan, plan_path, options, per_node, master, port, str(node)))
             for node in range(nnodes)]
    return LaunchSpec(plan.world_size, nnodes, per_node, nodes, env=job_env(plan, per_node),
                      notes=notes(plan, options.device))


def notes(plan: Plan, device: str) -> list[str]:
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


def msrun_argv(plan: Plan, plan_path: Path, options: LaunchOptions, per_node: int, master: str, port: int,
               node_rank: str) -> list[str]:
    return ["msrun", f"--worker_num={plan.world_size}", f"--local_worker_num={per_node}", f"--master_addr={master}",
            f"--master_port={port}", f"--node_rank={node_rank}", f"--log_dir={options.run_dir / 'msrun_log'}",
            "--join=True", f"--cluster_time_out={CLUSTER_TIME_OUT_S}", worker_script(),
            *worker_argv(plan_path, options)]


def _endpoint(endpoint: str | None) -> tuple[str, int]:
    if not endpoint:
        return "127.0.0.1", DEFAULT_PORT
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


def slurm_script(plan: Plan, plan_path: Path, options: LaunchOptions) -> str:
    """One srun task per node; each runs msrun with its node rank from SLURM_NODEID."""
    check_supported(plan, options.device)
    nnodes, per_node = node_layout(plan, LaunchOptions(**{**options.__dict__, "rdzv_endpoint": "slurm"}))
    spec = LaunchSpec(plan.world_size, nnodes, per_node, [], env=job_env(plan, per_node))
    argv = msrun_argv(plan, plan_path, options, per_node, "$HEAD_NODE", DEFAULT_PORT, "$SLURM_NODEID")
    # The head node and node rank are for the shell of each task to expand; every other word is quoted.
    words = " ".join(a if "$" in a else shlex.quote(a) for a in argv)
    resource = "#SBATCH --gres=npu:" if plan.cluster.primary.hardware.kind == "npu" else "#SBATCH --cpus-per-task="
    lines = ["#!/bin/bash", f"#SBATCH --job-name=gplan-ms-{re.sub(r'[^A-Za-z0-9_.-]', '-', plan.model.name)}",
             f"#SBATCH --nodes={spec.nnodes}", "#SBATCH --ntasks-per-node=1", f"{resource}{spec.nproc_per_node}",
             "#SBATCH --exclusive", "set -euo pipefail",
             'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             *[f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())],
             f"srun --nodes={spec.nnodes} --ntasks-per-node=1 bash -c {shlex.quote(words)}"]
    return "\n".join(lines) + "\n"


def run(spec: LaunchSpec, options: LaunchOptions, echo) -> None:
    """Run this node's msrun; msrun starts the workers with the `python` of PATH, so this
    interpreter's directory goes first."""
    argv = [str(Path(sys.executable).with_name("msrun")), *spec.nodes[options.node_rank].argv[1:]]
    options.run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with open(options.run_dir / "msrun.log", "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            for line in proc.stdout:
                log.write(line)
            code = proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
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
