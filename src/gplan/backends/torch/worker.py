"""The torch worker: one process per rank under torchrun, running the plan it is given.

    python -m gplan.backends.torch.worker --plan plan.json --run-dir DIR --steps N [...]

Read top to bottom, `main` is the table of contents: process group and mesh, the model chunks of
this rank (`parallelize.build_chunks`: built on the meta device, then tp, cp, recompute, dp/zero
applied, then materialised and initialised), the pipeline schedule, the optimizer, resume, the training loop, the run report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel
from torch.profiler import record_function

from gplan.backends.common import add_worker_options, device_mismatch, global_batch
from gplan.backends.resume import checkpoint_layout
from gplan.backends.capability import refuse_unsupported
from gplan.backends.torch import apply_pp, checkpoint, profiling
from gplan.backends.torch.apply_cp import load_balanced_positions
from gplan.backends.torch.apply_dp import average_expert_gradients, average_gradients
from gplan.backends.torch.model import init_weights
from gplan.backends.torch.apply_lowp import after_optimizer_step, check_capability, describe
from gplan.backends.torch.parallelize import build_chunks, fsdp_float8_all_gather, grad_mesh, sixteen_bit
from gplan.plan import Plan, read_plan
from gplan.report import RankReport, build_report, write_report

PG_TIMEOUT_S = float(os.environ.get("GPLAN_PG_TIMEOUT_S", "300"))
"""Every collective gives up after this long: a lost rank never hangs the job forever."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = add_worker_options(argparse.ArgumentParser(prog="gplan-torch-worker"))
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--resume-from", type=Path, default=None)
    return parser.parse_args(argv)


@dataclass
class Job:
    """What this rank runs: its model chunks, their optimizers, and how one step executes."""

    plan: Plan
    mesh: DeviceMesh
    device: torch.device
    parts: list[torch.nn.Module]
    optimizers: list[torch.optim.Optimizer]
    schedule: object | None
    stage: int
    is_last_stage: bool
    autocast: bool
    tp_mesh: DeviceMesh | None
    virtual_stages: list[int]
    log: "RankLog"
    tied_group: object | None = None
    """The embedding–head pair group when a tied model's ends sit on different stages."""
    edp_group: object | None = None
    """Mixture of experts: the expert data-parallel group (parallelize.expert_mesh)."""
    recipe: str | None = None
    """The low-precision GEMM recipe this rank runs (apply_lowp.describe), for the run report."""
    step_times_s: list[float] = field(default_factory=list)
    resumed: dict | None = None
    """A checkpoint of another layout this run continued from (`--resume-from`), for the run report."""


class RankLog:
    """Each rank's own log file (the launcher shows its last lines when the rank fails); rank 0
    also echoes to stderr."""

    def __init__(self, run_dir: Path, rank: int):
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.file = open(run_dir / "logs" / f"rank{rank}.log", "a", buffering=1)
        self.echo = rank == 0

    def __call__(self, message: str) -> None:
        line = f"{datetime.now().strftime('%H:%M:%S')} {message}"
        self.file.write(line + "\n")
        if self.echo:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    log = RankLog(args.run_dir, rank)
    (args.run_dir / "logs" / f"rank{rank}.pid").write_text(str(os.getpid()))
    try:
        plan = read_plan(args.plan)
        device = pick_device(args.device, local_rank)
        check_device(plan, rank, device)
        check_capability(plan.training.precision, device)
        init_distributed(device)
        job = build_job(plan, device, args, log)
        first_step = resume(job, args)
        losses = train(job, args, first_step)
        report(job, args, first_step, losses)
        log("done")
        dist.destroy_process_group()
        return 0
    except Exception:  # noqa: BLE001 - the launcher reads this rank's log to name the failure
        log("FAILED\n" + traceback.format_exc())
        return 1
    finally:
        log.file.close()


# ---- setup ---------------------------------------------------------------------------------------

def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def check_device(plan: Plan, rank: int, device: torch.device) -> None:
    """Refuse, before any collective, a GPU smaller than the one the plan priced this rank on."""
    if device.type != "cuda":
        return
    problem = device_mismatch(plan, rank, torch.cuda.get_device_name(device),
                              torch.cuda.get_device_properties(device).total_memory)
    if problem:
        raise RuntimeError(problem)


def init_distributed(device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=PG_TIMEOUT_S), **kwargs)


def build_mesh(plan: Plan, device: torch.device) -> DeviceMesh:
    """The plan's rank grid (axes outermost first, tp innermost), as one named DeviceMesh."""
    if dist.get_world_size() != plan.world_size:
        raise ValueError(f"the plan needs {plan.world_size} ranks, torchrun started {dist.get_world_size()}")
    return init_device_mesh(device.type, tuple(plan.placement.mesh_shape),
                            mesh_dim_names=tuple(plan.placement.axis_order))


def build_job(plan: Plan, device: torch.device, args: argparse.Namespace, log: RankLog) -> Job:
    refuse_unsupported(plan, "torch")
    mesh = build_mesh(plan, device)
    c = plan.parallel
    pp_rank = mesh["pp"].get_local_rank()
    tp_mesh = mesh["tp"] if c.tp > 1 else None

    def materialise(part: torch.nn.Module) -> None:
        part.to_empty(device=device)
        part.tie_weights()
        init_weights(part, args.seed)

    built = build_chunks(plan, mesh, pp_rank, device, sixteen_bit(plan, device), materialise)
    parts = built.parts
    loss_fn = make_loss(tp_mesh)
    schedule = apply_pp.build_schedule(plan, built.stages, loss_fn) if c.pp > 1 else None
    if args.profile and schedule is not None:
        profiling.label_pipeline_stages(built.stages)
    optimizers = [torch.optim.AdamW(p.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1) for p in parts]
    autocast = device.type == "cuda" and plan.training.base_precision in ("bf16", "fp16")
    log(f"rank {dist.get_rank()}: stage {pp_rank}, layers {[i for ch in apply_pp.rank_chunks(plan, pp_rank) for i in ch.layer_ids]}, "
        f"{sum(p.numel() for part in parts for p in part.parameters())} parameters here (local shards)")
    tied_group = apply_pp.tied_pair_group(plan, dist.get_rank())
    recipe = describe(plan.training.precision, device.type != "cuda", built.low_precision_layers,
                      fsdp_float8_all_gather(plan))
    if recipe:
        log(f"rank {dist.get_rank()}: {recipe}")
    return Job(plan, mesh, device, parts, optimizers, schedule, pp_rank, pp_rank == c.pp - 1, autocast, tp_mesh,
               built.virtual_stages, log, tied_group=tied_group, edp_group=built.edp_group, recipe=recipe)


def make_loss(tp_mesh: DeviceMesh | None):
    """Mean next-token cross-entropy; with tp the logits stay sharded over the vocabulary and the
    loss is computed without gathering them (`loss_parallel`)."""

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if tp_mesh is None:
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        sharded = DTensor.from_local(logits.float(), tp_mesh, [Shard(-1)])
        return F.cross_entropy(sharded.flatten(0, 1), targets.flatten())

    return loss_fn


def plan_fingerprint(plan: Plan) -> str:
    """Identifies the layout a checkpoint belongs to (inputs, degrees and split)."""
    blob = json.dumps([plan.digest, plan.parallel.model_dump(mode="json"),
                       [s.model_dump(mode="json", include={"layer_start", "layer_end"}) for s in plan.stages]])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resume(job: Job, args: argparse.Namespace) -> int:
    if args.resume_from is not None:  # another plan's checkpoint, resharded into this layout
        from gplan.backends.resume import check_resume

        found = check_resume(job.plan, args.resume_from)
        step = checkpoint.load(found.path, job.parts, job.optimizers, job.virtual_stages, plan_fingerprint(job.plan),
                               other_layout=True)
        job.resumed = {"checkpoint": str(found.path), "step": step,
                       "resharded": {k: list(v) for k, v in found.changes.items()}, "notes": found.notes}
        job.log(f"resumed from {found.path} (step {step}), resharded over "
                f"{', '.join(f'{k} {a}→{b}' for k, (a, b) in found.changes.items()) or 'nothing: the same layout'}")
        return step
    if not (args.resume and args.checkpoint_dir):
        return 0
    found = checkpoint.latest(args.checkpoint_dir)
    if found is None:
        job.log(f"no checkpoint in {args.checkpoint_dir}; starting from step 0")
        return 0
    step = checkpoint.load(found[1], job.parts, job.optimizers, job.virtual_stages, plan_fingerprint(job.plan))
    job.log(f"resumed from {found[1]} (step {step})")
    return step


# ---- training ------------------------------------------------------------------------------------

def train(job: Job, args: argparse.Namespace, first_step: int) -> list[float]:
    plan = job.plan
    dp_rank = job.mesh["dp"].get_local_rank()
    positions = None
    if plan.parallel.cp > 1:
        cp = plan.parallel.cp
        positions = load_balanced_positions(plan.training.seq_length, cp, job.mesh["cp"].get_local_rank())
    losses = []
    tracer = profiling.StepProfiler(args.profile, job.device, first_step + args.warmup_steps,
                                    args.run_dir / "profile" / f"rank{dist.get_rank()}.json")
    for step in range(first_step, args.steps):
        inputs, targets = dp_slice(plan, step, dp_rank, args)
        if positions is not None:  # this cp rank's tokens (and their next tokens) of every sequence
            inputs, targets = inputs[:, positions].contiguous(), targets[:, positions].contiguous()
        dist.barrier()
        tracer.before_step(step)
        start = time.perf_counter()
        with record_function("gplan:step"):
            loss = train_step(job, inputs.to(job.device), targets.to(job.device))
            if job.device.type == "cuda":
                torch.cuda.synchronize()
        job.step_times_s.append(time.perf_counter() - start)
        tracer.after_step()
        losses.append(loss)
        job.log(f"step {step + 1}/{args.steps} loss {loss:.6f} time {job.step_times_s[-1]:.3f} s")
        if args.checkpoint_dir and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            path = checkpoint.save(args.checkpoint_dir, step + 1, job.parts, job.optimizers, job.virtual_stages,
                                   plan_fingerprint(plan), checkpoint_layout(plan))
            job.log(f"checkpoint {path}")
    traced = tracer.close()
    if traced:
        job.log(f"profiler trace {traced}")
    return losses


def dp_slice(plan: Plan, step: int, dp_rank: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's rows of the step's global batch: inputs and next-token targets."""
    t = plan.training
    rows = torch.from_numpy(global_batch(step, plan.model.vocab_size, t.seq_length, t.gbs, args.seed, args.data))
    rows = rows.chunk(plan.parallel.dp)[dp_rank]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def train_step(job: Job, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """One optimizer step over this rank's share of the global batch; returns the global mean loss."""
    c = job.plan.parallel
    for opt in job.optimizers:
        opt.zero_grad(set_to_none=True)
    with _contexts(job):
        if job.schedule is not None:
            losses: list = []
            if job.stage == 0:
                job.schedule.step(inputs, target=targets if job.is_last_stage else None, losses=losses)
            else:
                job.schedule.step(target=targets if job.is_last_stage else None, losses=losses)
            local = torch.stack([_local(x) for x in losses]).mean() if losses else None
        else:
            local = _accumulate(job, inputs, targets, c.num_microbatches)
    with record_function("gplan:grad_sync"):
        if c.zero == 0:
            average_gradients(job.parts, grad_mesh(job.mesh, job.plan).get_group(), c.dp * c.cp)
        if job.plan.model.is_moe:
            average_expert_gradients(job.parts, job.edp_group, c.edp, c.dp * c.cp)
        apply_pp.reduce_tied_gradients(job.parts, job.tied_group)
    with record_function("gplan:optimizer"):
        for opt in job.optimizers:
            opt.step()
        after_optimizer_step(job.parts, job.plan.training.precision, fsdp_float8_all_gather(job.plan))
    return global_mean_loss(job, local)


def _accumulate(job: Job, inputs: torch.Tensor, targets: torch.Tensor, num_microbatches: int) -> torch.Tensor:
    """No pipeline: run the micro-batches one after another, summing gradients of loss/m. FSDP reduce-scatters
    each micro-batch's gradients into the sharded ones (its default): the plan prices sharded gradients, and
    deferring the reduction to the last micro-batch would hold every gradient whole, in fp32, meanwhile."""
    model = job.parts[0]
    total = torch.zeros((), device=job.device)
    for x, y in zip(inputs.chunk(num_microbatches), targets.chunk(num_microbatches)):
        with record_function("gplan:forward"):
            loss = make_loss(job.tp_mesh)(model(x), y) / num_microbatches
        with record_function("gplan:backward"):
            loss.backward()
        total += _local(loss).detach()
    return total


def _local(x: torch.Tensor) -> torch.Tensor:
    return (x.full_tensor() if isinstance(x, DTensor) else x).detach()


class _contexts:
    """loss_parallel (tp: the vocabulary-sharded loss and its backward) and autocast (GPU)."""

    def __init__(self, job: Job):
        self.stack = []
        if job.tp_mesh is not None:
            self.stack.append(loss_parallel())
        if job.autocast:
            dtype = torch.bfloat16 if job.plan.training.precision == "bf16" else torch.float16
            self.stack.append(torch.autocast(job.device.type, dtype=dtype))

    def __enter__(self):
        for ctx in self.stack:
            ctx.__enter__()

    def __exit__(self, *exc):
        for ctx in reversed(self.stack):
            ctx.__exit__(*exc)


def global_mean_loss(job: Job, local: torch.Tensor | None) -> float:
    """Average the last stage's losses over its dp ranks (tp and cp ranks hold copies)."""
    c = job.plan.parallel
    value = torch.zeros((), device=job.device, dtype=torch.float64)
    if job.is_last_stage and local is not None:
        value += local.double()
    dist.all_reduce(value)
    return float(value) / (c.dp * c.tp * c.cp)


# ---- report --------------------------------------------------------------------------------------

def peak_memory(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), "rss"


def report(job: Job, args: argparse.Namespace, first_step: int, losses: list[float]) -> None:
    memory, kind = peak_memory(job.device)
    mine = RankReport(rank=dist.get_rank(), stage=job.stage, step_times_s=job.step_times_s,
                      peak_memory_bytes=memory, memory_kind=kind)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine.model_dump())
    if dist.get_rank() != 0:
        return
    device = torch.cuda.get_device_name(job.device) if job.device.type == "cuda" else "cpu"
    write_report(build_report(
        job.plan, backend="torch", framework_version=torch.__version__, device=device,
        compute_dtype=job.plan.training.base_precision if job.autocast else "fp32", gemm_recipe=job.recipe,
        first_step=first_step,
        steps=args.steps, warmup_steps=args.warmup_steps, losses=losses,
        ranks=[RankReport.model_validate(r) for r in gathered], resumed=job.resumed), args.run_dir / "run_report.json")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: gloo's worker threads can still hold work objects whose tensors
    # need the GIL while the interpreter is torn down, which aborts the process after a clean run
    # (pytorch/pytorch#179291). Everything the run produced is written and closed by now.
    os._exit(code)
