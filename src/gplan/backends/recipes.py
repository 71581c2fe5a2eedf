"""The launch recipe: how a job of a plan starts, written once and read by every place that starts
or writes down a job — `gplan launch` (both backends), `--slurm`, the SLURM and Kubernetes exports, the
Megatron-LM and torchtitan scripts, and the profiler's link job.

A recipe is data (nodes, processes per node, the program each process runs, the job's environment);
`torchrun_argv` and `msrun_argv` turn it into a launcher's argv for one node, `slurm_script` into a
batch script (backends.slurm). Arguments stay lists until the very end: a word is shell-quoted only when a script is
written, and only words that hold a `$` are left for the shell to expand (double-quoted).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from gplan.backends.protocol import JobRecipe, LaunchOptions
from gplan.errors import InputError
from gplan.plan import Plan

TORCHRUN_PORT = 29500
MSRUN_PORT = 8118
"""msrun's default scheduler port."""
MSRUN_CLUSTER_TIME_OUT_S = 300


def default_nodes(plan: Plan) -> tuple[int, int]:
    """(nodes, processes per node) the plan's world size takes on its cluster."""
    per_node = min(plan.world_size, plan.cluster.primary.devices_per_node)
    return -(-plan.world_size // per_node), per_node


def node_layout(plan: Plan, options: LaunchOptions) -> tuple[int, int]:
    """(nnodes, nproc_per_node), checked against the plan's world size (exit 3 when they differ)."""
    world = plan.world_size
    suggested_nodes, suggested_per_node = default_nodes(plan)
    per_node = options.nproc_per_node or suggested_per_node
    nnodes = options.nnodes or -(-world // per_node)
    if per_node * nnodes != world:
        raise InputError(f"the plan needs {world} ranks; --nproc-per-node {per_node} × --nnodes {nnodes} = {per_node * nnodes}",
                         hint=f"use --nproc-per-node {suggested_per_node} --nnodes {suggested_nodes}, or re-plan for these devices")
    if not 0 <= options.node_rank < nnodes:
        raise InputError(f"--node-rank {options.node_rank} outside 0..{nnodes - 1}", hint="node ranks count from 0")
    if nnodes > 1 and not options.rdzv_endpoint:
        raise InputError(f"{nnodes} nodes need a rendezvous", hint="pass --rdzv-endpoint HOST:PORT (node 0's address)")
    return nnodes, per_node


def torchrun_argv(job: JobRecipe, node_rank: str | None = None, endpoint: str | None = None,
                  rdzv_id: str | None = None, separator: str = " ") -> list[str]:
    """`torchrun` for one node of `job`. One node without an endpoint: `--standalone`. A given `node_rank`:
    the static rendezvous at `endpoint` (node 0's address), the only one that keeps a node rank — c10d
    numbers the nodes by sorted host name and ignores `--node-rank` (torch's dynamic_rendezvous assigns
    ranks over `sorted(participants)`), so ranks 0… of the plan could land on any node, and on a
    heterogeneous cluster on the wrong hardware. `node_rank` None: c10d rendezvous, numbering the nodes
    itself (SLURM, Kubernetes: identical nodes). `separator="="` writes `--flag=value` words (what
    Kubernetes manifests conventionally carry)."""
    def opt(flag: str, value: object) -> list[str]:
        return [f"{flag}={value}"] if separator == "=" else [flag, str(value)]

    if job.nnodes == 1 and endpoint is None:
        head = ["--standalone", *opt("--nnodes", 1), *opt("--nproc-per-node", job.nproc_per_node)]
    elif node_rank is not None:
        head = [*opt("--nnodes", job.nnodes), *opt("--node-rank", node_rank), *opt("--nproc-per-node", job.nproc_per_node),
                *opt("--rdzv-backend", "static"), *opt("--rdzv-endpoint", endpoint)]
    else:
        head = [*opt("--nnodes", job.nnodes), *opt("--nproc-per-node", job.nproc_per_node), *opt("--rdzv-backend", "c10d"),
                *opt("--rdzv-endpoint", endpoint), *(opt("--rdzv-id", rdzv_id) if rdzv_id else [])]
    # No restarts: a failed rank ends the job (gplan names it); a quick monitor notices it within 0.5 s.
    return ["torchrun", *head, *opt("--max-restarts", 0), *opt("--monitor-interval", 0.5), *job.program]


def msrun_argv(job: JobRecipe, node_rank: str, master: str, port: int | str, log_dir: Path | str) -> list[str]:
    """`msrun` for one node of `job` (msrun runs a script: `job.program` starts with its path)."""
    return ["msrun", f"--worker_num={job.world_size}", f"--local_worker_num={job.nproc_per_node}",
            f"--master_addr={master}", f"--master_port={port}", f"--node_rank={node_rank}", f"--log_dir={log_dir}",
            "--join=True", f"--cluster_time_out={MSRUN_CLUSTER_TIME_OUT_S}", *job.program]


def script_torchrun_line(nproc_per_node: int, program: list[str]) -> str:
    """The torchrun line of an export script that reads NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT
    from its environment (the same command on every node)."""
    job = JobRecipe("$NNODES", nproc_per_node, program)
    return shell_words(torchrun_argv(job, node_rank="$NODE_RANK", endpoint="$MASTER_ADDR:$MASTER_PORT"))


def script_node_variables(nnodes: int) -> list[str]:
    """The variables `script_torchrun_line` reads, with one node's defaults."""
    return [f"NNODES=${{NNODES:-{nnodes}}}", "NODE_RANK=${NODE_RANK:-0}", "MASTER_ADDR=${MASTER_ADDR:-localhost}",
            f"MASTER_PORT=${{MASTER_PORT:-{TORCHRUN_PORT}}}"]


def shell_words(argv: list[str]) -> str:
    """One shell line: words with a `$` are double-quoted for the shell to expand, the rest quoted."""
    return " ".join(f'"{a}"' if "$" in a else shlex.quote(a) for a in argv)


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """For people to read and paste (`--dry-run`), not for running."""
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())] + [shlex.quote(a) for a in argv])


def env_lines(env: dict[str, str]) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]


def job_name(prefix: str, plan: Plan) -> str:
    return f"{prefix}-{re.sub(r'[^A-Za-z0-9_.-]', '-', plan.model.name)}"


def node_groups_of(plan: Plan, per_node: int) -> list[int]:
    """The node group every node rank must run on: the group of the stage its ranks belong to (ranks
    form the grid pp, dp, cp, tp, so rank r is in stage r // (dp·cp·tp))."""
    per_stage = plan.parallel.dp * plan.parallel.cp * plan.parallel.tp
    out = []
    for node in range(-(-plan.world_size // per_node)):
        groups = {plan.stages[r // per_stage].node_group for r in range(node * per_node, min((node + 1) * per_node, plan.world_size))}
        if len(groups) > 1:
            raise InputError(f"node rank {node} would host stages of node groups {sorted(groups)}",
                             hint="re-plan with stages of whole nodes (dp·cp·tp a multiple of the devices per node)")
        out.append(groups.pop())
    return out


def node_ranks_by_group(plan: Plan, per_node: int) -> dict[int, list[int]]:
    """Each node group used, in order, with the node ranks that must run on it (`node_groups_of`)."""
    by_group: dict[int, list[int]] = {}
    for node, group in enumerate(node_groups_of(plan, per_node)):
        by_group.setdefault(group, []).append(node)
    return dict(sorted(by_group.items()))
