"""The launch recipe: how a job of a plan starts, written once and read by every place that starts
or writes down a job — `gplan launch` (both backends), `--slurm`, the SLURM and Kubernetes exports, the
Megatron-LM and torchtitan scripts, and the profiler's link job.

A recipe is data (nodes, processes per node, the program each process runs, the job's environment);
`torchrun_argv` and `msrun_argv` turn it into a launcher's argv for one node, `slurm_script` into a
batch script. Arguments stay lists until the very end: a word is shell-quoted only when a script is
written, and only words that hold a `$` are left for the shell to expand (double-quoted).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from gplan.errors import BackendError, InputError
from gplan.plan import Plan, layouts_of
from gplan.spec.targets import ENGINE_OPTIONS, TARGETS, lacked_options, refusals

TORCHRUN_PORT = 29500
MSRUN_PORT = 8118
"""msrun's default scheduler port."""
MSRUN_CLUSTER_TIME_OUT_S = 300


@dataclass(frozen=True)
class LaunchOptions:
    """How to run a plan; the worker's options are passed through unchanged."""

    run_dir: Path
    nproc_per_node: int | None = None
    """Processes per node; default: the plan cluster's devices per node (or the world size)."""
    nnodes: int | None = None
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """HOST:PORT of the rendezvous (node 0) for several nodes."""
    rdzv_id: str = "gplan"
    steps: int = 10
    warmup_steps: int = 2
    lr: float = 3e-3
    seed: int = 0
    data: Path | None = None
    device: str = "auto"
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    resume: bool = False
    resume_from: Path | None = None
    """A checkpoint written under another plan (`backends.resume.check_resume`), loaded resharded."""
    profile: bool = False
    """Trace the steps after the warm-up with the framework's profiler (`profile/rank{R}.json` in the run
    directory)."""


@dataclass(frozen=True)
class NodeCommand:
    node_rank: int
    argv: list[str]


@dataclass(frozen=True)
class LaunchSpec:
    world_size: int
    nnodes: int
    nproc_per_node: int
    nodes: list[NodeCommand]
    env: dict[str, str] = field(default_factory=dict)
    """Added to the environment of every node."""
    notes: list[str] = field(default_factory=list)
    """Where the engine runs something other than what the plan priced (printed before the run)."""


@dataclass(frozen=True)
class JobRecipe:
    """One job: `nnodes` × `nproc_per_node` processes, each running `program` with `env` added."""

    nnodes: int | str
    """A count, or a shell variable (`$NNODES`) in a script that takes it at run time."""
    nproc_per_node: int
    program: list[str]
    """What each process runs: `["-m", module, *args]` or `[script, *args]`."""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return int(self.nnodes) * self.nproc_per_node


def refuse_unsupported(plan: Plan, target: str) -> None:
    """Exit 3 before anything starts when the target cannot run the plan as priced, naming the
    capability and the search option that avoids it."""
    found = refusals(TARGETS[target], plan.model, plan.parallel, plan.parallel.num_microbatches, layouts_of(plan),
                     plan.training.precision)
    if found:
        raise InputError(f"the {target} backend cannot run this plan ({found[0].capability}): {found[0].detail}",
                         hint=found[0].hint(target, plan.target))


def lacked_switch_notes(plan: Plan, target: str) -> list[str]:
    """The plan's engine switches (TrainingSpec: CUDA graphs, the MoE overlap, bf16 gradients, FP8 parameters)
    the backend's worker does not have: it runs without them, so the measured step and memory differ."""
    lacked = lacked_options(plan.training, target)
    if not lacked:
        return []
    flags = ", ".join(ENGINE_OPTIONS[o] for o in lacked)
    return [f"the plan was priced with {flags} ({plan.training.engine or 'megatron'}'s); the {target} worker runs "
            f"without: measured step and memory differ from the plan's (search with --target {target} to match)"]


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


def check_launch_flags(steps: int, warmup_steps: int, data: Path | None, checkpoint_dir: Path | None,
                       checkpoint_every: int, resume: bool, device: str, profile: bool = False) -> None:
    """The worker options `gplan launch` takes, refused with a hint before anything starts."""
    if steps < 1 or warmup_steps < 0:
        raise InputError(f"--steps {steps} --warmup-steps {warmup_steps}: steps ≥ 1, warm-up ≥ 0", hint="for example --steps 10")
    if data is not None and not data.is_file():
        raise InputError(f"--data {data}: no such file", hint="a flat binary array of token ids")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise InputError("--checkpoint-every and --resume need --checkpoint-dir", hint="add --checkpoint-dir DIR")
    if profile and steps <= warmup_steps:
        raise InputError(f"--profile traces the steps after the warm-up: --steps {steps} leaves none after "
                         f"--warmup-steps {warmup_steps}", hint=f"for example --steps {warmup_steps + 3}")
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r}", hint="auto | cpu | cuda")


# ---- running one node's launcher ---------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE_S = 10.0
"""After SIGTERM, how long the launcher and its workers get before SIGKILL (stop within 30 s)."""


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_job(argv: list[str], env: dict[str, str], log_path: Path, echo=None) -> int:
    """Run a launcher (torchrun, msrun) in its own process group, copying its output to `log_path`
    (and `echo`); return its exit code. Whatever it leaves is killed when it ends. SIGTERM, SIGINT or
    SIGHUP to gplan stops the whole job — SIGTERM to the group, SIGKILL after GRACE_S — and raises a
    BackendError naming what was stopped: a job never outlives the command that started it."""
    handlers = _install(_raise_stop)
    proc = None
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            # When the launcher exits, whatever it left holding the output pipe is ended, so reading
            # the pipe ends too.
            threading.Thread(target=_end_group_after, args=(proc,), daemon=True).start()
            for line in proc.stdout:
                log.write(line)
                if echo:
                    echo(line.rstrip("\n"))
            return proc.wait()
    except _Stop as stop:
        name = signal.Signals(stop.signum).name
        _stop_group(proc, graceful=True)
        raise BackendError(f"stopped by {name}: {Path(argv[0]).name} (pid {proc.pid if proc else '-'}) and every "
                           "worker it started were ended", hint=f"partial logs are in {log_path.parent}") from None
    finally:
        _stop_group(proc, graceful=False)
        _restore(handlers)


def _end_group_after(proc: subprocess.Popen) -> None:
    proc.wait()
    _signal_group(proc, signal.SIGKILL)


def _raise_stop(signum: int, frame) -> None:
    raise _Stop(signum)


def _install(handler) -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in STOP_SIGNALS}


def _restore(handlers: dict) -> None:
    for s, previous in handlers.items():
        signal.signal(s, previous)


def _stop_group(proc: subprocess.Popen | None, graceful: bool) -> None:
    """End the launcher's process group: SIGTERM and a grace period when asked, then SIGKILL."""
    if proc is None:
        return
    if graceful:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ---- `gplan launch`, whole ------------------------------------------------------------------------

SLURM_RENDEZVOUS = "slurm-head:0"
"""What a launch rendered for a SLURM script rendezvouses at: the allocation's head node, which the
script resolves at run time — rendered only for the checks and notes."""


@dataclass(frozen=True)
class LaunchOutcome:
    """What `gplan launch` did."""

    kind: str
    """validated | slurm | dry_run | ran | node_finished (a node other than 0, the report on node 0)."""
    backend: str
    validation: object = None
    """The backend's ValidationReport (kind validated)."""
    spec: LaunchSpec | None = None
    written: list[Path] = field(default_factory=list)
    report_path: Path | None = None
    plan: Plan | None = None
    """The plan that ran (scaled down when asked)."""
    node_rank: int = 0


def launch_plan(plan: Plan, backend_name: str, options: LaunchOptions, *, validate_only: bool = False,
                slurm: Path | None = None, dry_run: bool = False, scale=None, note=None, echo=None) -> LaunchOutcome:
    """Validate, write a SLURM script, print the commands, or run `plan` on `backend_name`: the layout
    checked on a fake process group (validate_only, the plan as written), else the plan scaled down as
    asked (`scale`), rendered for every node — its notes said (`note`) before anything runs — and then
    written down or run, the plan that ran and its run report in `options.run_dir`."""
    from gplan.backends.base import backend, require_framework
    from gplan.io import atomic_write_text
    from gplan.plan import write_plan

    impl = backend(backend_name)
    if validate_only:  # what the backend cannot run is refused first, as a launch would
        refuse_unsupported(plan, backend_name)
        return LaunchOutcome("validated", backend_name, validation=impl.validate(plan), plan=plan)
    plan = scale(plan) if scale else plan
    plan_path = options.run_dir / "plan.json"
    rendered = options if not slurm or options.rdzv_endpoint else replace(options, rdzv_endpoint=SLURM_RENDEZVOUS)
    spec = impl.render(plan, plan_path, rendered)
    for line in spec.notes:
        (note or (lambda _: None))(line)
    if slurm:
        script = impl.slurm_script(plan, plan_path, options)
        options.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(slurm, script)
        write_plan(plan, plan_path)
        return LaunchOutcome("slurm", backend_name, spec=spec, written=[slurm, plan_path], plan=plan)
    if dry_run:
        return LaunchOutcome("dry_run", backend_name, spec=spec, plan=plan)
    require_framework(backend_name)
    options.run_dir.mkdir(parents=True, exist_ok=True)
    write_plan(plan, plan_path)
    if options.checkpoint_dir:  # where `--resume-from RUN_DIR` finds this run's checkpoints
        from gplan.backends.resume import POINTER

        atomic_write_text(options.run_dir / POINTER, str(options.checkpoint_dir) + "\n")
    impl.run(spec, options, echo=echo or (lambda _: None))
    report_path = options.run_dir / "run_report.json"
    if spec.nnodes > 1 and options.node_rank != 0 and not report_path.exists():
        return LaunchOutcome("node_finished", backend_name, spec=spec, plan=plan, node_rank=options.node_rank)
    return LaunchOutcome("ran", backend_name, spec=spec, report_path=report_path, plan=plan)
