"""SLURM batch scripts of a job recipe (backends.recipes): one `srun` task per node, or a heterogeneous
job with one component per node group. `gplan launch --slurm` and the SLURM export write them."""

from __future__ import annotations

import shlex

from gplan.backends.protocol import JobRecipe
from gplan.backends.recipes import env_lines, node_ranks_by_group, shell_words
from gplan.plan import Plan


def slurm_script(name: str, job: JobRecipe, resource_line: str, node_argv: list[str], header: list[str] = ()) -> str:
    """A batch script: one `srun` task per node, each running `node_argv` (which may use `$HEAD_NODE`,
    the first node of the allocation, and SLURM's own variables)."""
    words = shell_words(node_argv)
    run = f"srun --nodes={job.nnodes} --ntasks-per-node=1 bash -c {shlex.quote(words)}" if "$SLURM_NODEID" in words \
        else f"srun --nodes={job.nnodes} --ntasks-per-node=1 {words}"
    lines = ["#!/bin/bash", *header, f"#SBATCH --job-name={name}", f"#SBATCH --nodes={job.nnodes}",
             "#SBATCH --ntasks-per-node=1", resource_line, "#SBATCH --exclusive", "set -euo pipefail",
             'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', *env_lines(job.env), run]
    return "\n".join(lines) + "\n"


def hetero_slurm_script(name: str, job: JobRecipe, plan: Plan, resource_line, node_argv: list[str],
                        header: list[str] = ()) -> str:
    """A SLURM heterogeneous job: one component per node group (`#SBATCH hetjob` between them), each
    asking for its group's nodes by feature (`--constraint`, the group's hardware name), and one srun
    over all components. In such a step SLURM numbers the tasks across the components in order, so
    `SLURM_PROCID` indexes a table of the plan's node ranks — each node gets a rank of its own group —
    and torchrun's static rendezvous keeps them (c10d would renumber the nodes by host name)."""
    by_group = node_ranks_by_group(plan, job.nproc_per_node)
    order = list(by_group)
    ranks = [n for g in order for n in by_group[g]]
    lines = ["#!/bin/bash", *header]
    for c, (g, held) in enumerate(by_group.items()):
        lines.append(f"# component {c}: node group {g}, {len(held)} nodes of {plan.cluster.node_groups[g].hardware.name} "
                     f"(node ranks {', '.join(map(str, held))}); --constraint names the node feature, rename it to your "
                     "cluster's")
    for c, (g, held) in enumerate(by_group.items()):
        if c:
            lines.append("#SBATCH hetjob")
        if c == 0:
            lines.append(f"#SBATCH --job-name={name}")
        lines += [f"#SBATCH --nodes={len(held)}", "#SBATCH --ntasks-per-node=1", resource_line(g), "#SBATCH --exclusive",
                  f"#SBATCH --constraint={plan.cluster.node_groups[g].hardware.name}"]
    head_component = next(c for c, held in enumerate(by_group.values()) if 0 in held)  # node rank 0's component
    words = shell_words(node_argv)
    lines += ["set -euo pipefail",
              f'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_{head_component}" | head -n 1)',
              "export HEAD_NODE", *env_lines(job.env),
              f"NODE_RANKS=({' '.join(map(str, ranks))})  # by SLURM_PROCID: component 0's nodes first",
              'export GPLAN_NODE_RANKS="${NODE_RANKS[*]}"',
              "# shellcheck disable=SC2016  # the single-quoted line is expanded by each task's own shell",
              f"srun --het-group={','.join(map(str, range(len(order))))} --ntasks-per-node=1 bash -c "
              + shlex.quote('RANKS=($GPLAN_NODE_RANKS); NODE_RANK=${RANKS[$SLURM_PROCID]}; ' + words)]
    return "\n".join(lines) + "\n"
