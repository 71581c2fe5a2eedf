"""The MindSpore worker: one process per rank under msrun, running the plan it is given.

    msrun --worker_num N … worker.py --plan plan.json --run-dir DIR --steps N

`main` reads as the table of contents: the parallel context (data parallel on CPU; semi-automatic
parallelism with the plan's strategies, pipeline stages and optimizer sharding on Ascend and GPU),
the model with every operator's strategy and every layer's stage and recompute, the training loop,
the run report (the same run_report.json as the torch backend).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, One, initializer
from mindspore.communication import get_group_size, get_rank, init

from gplan.backends.common import add_worker_options, device_mismatch, global_batch
from gplan.backends.mindspore.device import RUNS_ON
from gplan.backends.mindspore.strategy import ParallelLayout, layout
from gplan.plan import Plan, read_plan
from gplan.report import RankReport, build_report, stage_of_rank, write_report
from gplan.spec.model import ModelSpec

INIT_STD = 0.02


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return add_worker_options(argparse.ArgumentParser(prog="gplan-mindspore-worker")).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = read_plan(args.plan)
    plan_layout = layout(plan)
    distributed = plan.world_size > 1
    if not distributed and os.environ.get("MS_ROLE") == "MS_SCHED":
        # msrun runs this script in its scheduler process too; a one-rank job never calls init(), so
        # the scheduler has no cluster to form and must not train (and write the report) a second time.
        return 0
    set_context(plan, plan_layout, args.device, distributed)
    rank = get_rank() if distributed else 0
    log = _log(args.run_dir, rank)
    try:
        check_device(plan, rank)
        ms.set_seed(args.seed)  # what MindSpore's own initializers draw from (lazy weights)
        weights = WeightInit(args.seed, lazy=distributed and uses_semi_auto())
        net = build_model(plan, plan_layout, weights)
        losses, step_times = train(net, plan, plan_layout, args, rank, distributed, log)
        report(plan, args, losses, step_times, distributed)
        log("done")
        return 0
    except Exception:  # noqa: BLE001 - the launcher reads this log to name the failure
        log("FAILED\n" + traceback.format_exc())
        return 1


def _log(run_dir: Path, rank: int):
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    path = run_dir / "logs" / f"rank{rank}.log"

    def log(message: str) -> None:
        with open(path, "a") as f:
            f.write(f"{datetime.now().strftime('%H:%M:%S')} {message}\n")

    return log


# ---- parallel context ----------------------------------------------------------------------------

def set_context(plan: Plan, plan_layout: ParallelLayout, device: str, distributed: bool) -> None:
    """CPU: PyNative data parallel. Ascend/GPU: graph mode, semi-automatic parallelism with the
    plan's device number, pipeline stages and optimizer sharding."""
    target = "CPU" if device == "cpu" else RUNS_ON[plan.cluster.primary.hardware.kind]  # the launcher checked it
    semi_auto = target != "CPU" and distributed
    ms.set_context(mode=ms.GRAPH_MODE if semi_auto else ms.PYNATIVE_MODE, device_target=target)
    if not distributed:
        return
    init()
    if not semi_auto:  # semi-automatic parallelism is configured on the AutoParallel wrapper instead
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=get_group_size())


def check_device(plan: Plan, rank: int) -> None:
    """Refuse, before the first step, an Ascend or GPU device smaller than the one the plan priced this
    rank on (the torch worker's check). `mindspore.hal.get_device_properties` reads the current device;
    before the device is initialised its memory reads 0, which is no evidence either way, so a tiny op
    runs first."""
    target = ms.get_context("device_target")
    if target == "CPU":
        return
    ops.ones((1,), ms.float32).asnumpy()  # initialises the device (Ascend reports 0 bytes before)
    properties = ms.hal.get_device_properties(ms.get_context("device_id"), target)
    total_bytes = getattr(properties, "total_memory", 0)
    if total_bytes:
        problem = device_mismatch(plan, rank, getattr(properties, "name", target), total_bytes)
        if problem:
            raise RuntimeError(problem)


def uses_semi_auto() -> bool:
    """Ascend and GPU run every plan, dp-only ones too, semi-automatically: the same strategies,
    optimizer sharding and micro-batching for all."""
    return ms.get_context("device_target") != "CPU"


# ---- the model -----------------------------------------------------------------------------------

def initial_value(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Ones for norm weights, N(0, 0.02) else, seeded by the parameter's name: the same weights in
    every layout."""
    if "norm" in name:
        return np.ones(shape, np.float32)
    rng = np.random.default_rng(seed * 1_000_003 + zlib.crc32(name.encode()))
    return (rng.standard_normal(shape) * INIT_STD).astype(np.float32)


@dataclass(frozen=True)
class WeightInit:
    """How the model's parameters get their values."""

    seed: int
    lazy: bool = False
    """False: `initial_value` now, the same weights in every layout (CPU, and the loss-match tests).
    True (semi-auto on Ascend/GPU): MindSpore's own initializers, drawn for each rank's slice when
    the step compiles, so no rank ever holds the whole model (see `build_model`)."""

    def parameter(self, name: str, shape: tuple[int, ...]) -> Parameter:
        if self.lazy:
            return Parameter(initializer(One() if "norm" in name else Normal(sigma=INIT_STD), shape, ms.float32), name=name)
        return Parameter(Tensor(initial_value(name, shape, self.seed)), name=name)


def rope_tables(seq: int, head_dim: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of RoPE (Su et al. 2021), shape (seq, head_dim/2), as the torch worker has them."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    angles = np.outer(np.arange(seq, dtype=np.float32), inv)
    return Tensor(np.cos(angles)), Tensor(np.sin(angles))


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, name: str, init: WeightInit, strategy, eps: float = 1e-5):
        super().__init__()
        self.weight = init.parameter(name, (dim,))
        self.square = ops.Square().shard(strategy)
        self.mean = ops.ReduceMean(keep_dims=True).shard(strategy)
        self.mul = ops.Mul()
        self.rsqrt = ops.Rsqrt()
        self.eps = eps

    def construct(self, x):
        return self.mul(x * self.rsqrt(self.mean(self.square(x), -1) + self.eps), self.weight)


class Linear(nn.Cell):
    """y = x Wᵀ with W [out, in] (MatMul(transpose_b=True)), sharded by the plan's strategy."""

    def __init__(self, d_in: int, d_out: int, name: str, init: WeightInit, strategy):
        super().__init__()
        self.weight = init.parameter(name, (d_out, d_in))
        self.matmul = ops.MatMul(transpose_b=True).shard(strategy)

    def construct(self, x):
        shape = x.shape
        out = self.matmul(x.reshape(-1, shape[-1]), self.weight)
        return out.reshape(shape[:-1] + (-1,))


class Block(nn.Cell):
    """A decoder layer; `tp_shard` > 1 builds the part one of that many tensor-parallel ranks holds
    (heads, kv heads and MLP width divided, head size kept), as the profiler measures it."""

    def __init__(self, spec: ModelSpec, i: int, init: WeightInit, s: dict, seq: int, tp_shard: int = 1):
        super().__init__()
        p = f"layers.{i}."
        self.heads, self.kv_heads = spec.num_attention_heads // tp_shard, spec.kv_heads // tp_shard
        self.head_dim = spec.kv_channels
        h, q, kv, ffn = spec.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim, spec.ffn_size // tp_shard
        self.attention_norm = RMSNorm(h, p + "attention_norm.weight", init, s["norm"])
        self.ffn_norm = RMSNorm(h, p + "ffn_norm.weight", init, s["norm"])
        self.wq = Linear(h, q, p + "attention.wq.weight", init, s["attention.wq"])
        self.wk = Linear(h, kv, p + "attention.wk.weight", init, s["attention.wk"])
        self.wv = Linear(h, kv, p + "attention.wv.weight", init, s["attention.wv"])
        self.wo = Linear(q, h, p + "attention.wo.weight", init, s["attention.wo"])
        self.w1 = Linear(h, ffn, p + "feed_forward.w1.weight", init, s["feed_forward.w1"])
        self.w2 = Linear(ffn, h, p + "feed_forward.w2.weight", init, s["feed_forward.w2"])
        self.w3 = Linear(h, ffn, p + "feed_forward.w3.weight", init, s["feed_forward.w3"])
        self.scores = ops.BatchMatMul(transpose_b=True).shard(s["attention.scores"])
        self.softmax = ops.Softmax(-1).shard(s["attention.softmax"])
        self.context = ops.BatchMatMul().shard(s["attention.context"])
        self.add = ops.Add().shard(s["residual_add"])
        self.mask = Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), k=1))
        self.scale = 1.0 / float(np.sqrt(spec.kv_channels))
        self.cos, self.sin = rope_tables(seq, spec.kv_channels, spec.rope_theta)

    def rotate(self, x):
        """RoPE on (batch, heads, seq, head_dim): pairs (x[2i], x[2i+1]) rotated by position."""
        b, n, s, d = x.shape
        pairs = x.reshape(b, n, s, d // 2, 2)
        a, c = pairs[..., 0], pairs[..., 1]
        cos, sin = self.cos[:s], self.sin[:s]
        return ops.stack((a * cos - c * sin, a * sin + c * cos), -1).reshape(b, n, s, d)

    def attention(self, x):
        b, s, _ = x.shape
        q = self.wq(x).reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.wk(x).reshape(b, s, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(b, s, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = self.rotate(q), self.rotate(k)
        groups = self.heads // self.kv_heads
        k, v = ops.repeat_interleave(k, groups, 1), ops.repeat_interleave(v, groups, 1)
        weights = self.softmax(self.scores(q, k) * self.scale + self.mask[:s, :s])
        return self.wo(self.context(weights, v).transpose(0, 2, 1, 3).reshape(b, s, -1))

    def construct(self, x):
        h = self.add(x, self.attention(self.attention_norm(x)))
        mlp = self.w2(ops.silu(self.w1(self.ffn_norm(h))) * self.w3(self.ffn_norm(h)))
        return self.add(h, mlp)


class Decoder(nn.Cell):
    """Llama-family decoder (RMSNorm, swiglu, GQA, RoPE, untied head), its loss, every layer's
    pipeline stage and recompute from the plan."""

    def __init__(self, spec: ModelSpec, seq: int, plan_layout: ParallelLayout, init: WeightInit):
        super().__init__()
        s = plan_layout.strategies
        self.embedding = init.parameter("tok_embeddings.weight", (spec.vocab_size, spec.hidden_size))
        self.gather = ops.Gather().shard(s["embedding"])
        self.layers = nn.CellList([Block(spec, i, init, s, seq) for i in range(spec.num_layers)])
        for block, stage, option in zip(self.layers, plan_layout.layer_stage, plan_layout.layer_recompute):
            block.pipeline_stage = stage
            if option == "full":
                block.recompute()
            elif option == "selective":
                block.softmax.recompute()
        self.norm = RMSNorm(spec.hidden_size, "norm.weight", init, s["norm"])
        self.output = Linear(spec.hidden_size, spec.vocab_size, "output.weight", init, s["head"])
        self.loss = nn.CrossEntropyLoss()

    def construct(self, tokens, targets):
        h = self.gather(self.embedding, tokens, 0)
        for block in self.layers:
            h = block(h)
        logits = self.output(self.norm(h))
        return self.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(plan: Plan, plan_layout: ParallelLayout, init: WeightInit) -> Decoder:
    """Lazy weights are built under `no_init_parameters`: MindSpore would otherwise draw every
    parameter whole as it is created; this way each rank draws its slices when the step compiles."""
    if not init.lazy:
        return Decoder(plan.model, plan.training.seq_length, plan_layout, init)
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        return Decoder(plan.model, plan.training.seq_length, plan_layout, init)


# ---- training ------------------------------------------------------------------------------------

def batch(step: int, plan: Plan, args: argparse.Namespace) -> np.ndarray:
    t = plan.training
    return global_batch(step, plan.model.vocab_size, t.seq_length, t.gbs, args.seed, args.data).astype(np.int32)


def semi_auto_step(net: Decoder, plan_layout: ParallelLayout, optimizer):
    """Ascend/GPU: one jitted step under MindSpore's AutoParallel — the operators' shard()
    strategies; the plan's m micro-batches through the Pipeline cell (the layers' stages, interleaved
    for vpp > 1) or, without pipeline stages, through gradient accumulation; optimizer sharding (hsdp)
    for zero ≥ 1. Every rank is handed the whole global batch ("full_batch") and MindSpore takes its
    dp slice, so the step sees gbs/dp rows per rank in m micro-batches, as the plan priced.
    Its compilation needs Ascend or GPU devices; on CPU only its construction is tested."""
    from mindspore.parallel.auto_parallel import AutoParallel
    from mindspore.parallel.nn import PipelineGradReducer

    network = micro_batched(net, plan_layout)
    grad_fn = ms.value_and_grad(network, None, optimizer.parameters)
    # The reducer sums the micro-batches' gradients; opt_shard left unset would read the global
    # context, which AutoParallel does not set.
    reducer = PipelineGradReducer(optimizer.parameters, opt_shard=plan_layout.optimizer_parallel) if network is not net else None

    @ms.jit
    def step(tokens, targets):
        loss, grads = grad_fn(tokens, targets)
        if reducer is not None:
            grads = reducer(grads)
        optimizer(grads)
        return loss

    parallel = AutoParallel(step, parallel_mode="semi_auto")
    parallel.dataset_strategy("full_batch")
    if plan_layout.pipeline_stages > 1:
        parallel.pipeline(stages=plan_layout.pipeline_stages, interleave=plan_layout.interleave)
    if plan_layout.optimizer_parallel:
        parallel.hsdp()
    return parallel


def micro_batched(net: Decoder, plan_layout: ParallelLayout) -> nn.Cell:
    """The plan's m micro-batches: MindSpore's Pipeline cell with pipeline stages, its gradient
    accumulation without them, the network itself for m = 1."""
    from mindspore.parallel.nn import GradAccumulation, Pipeline

    m = plan_layout.micro_batch_num
    if plan_layout.pipeline_stages > 1:
        return Pipeline(net, micro_size=m)
    return GradAccumulation(net, micro_size=m) if m > 1 else net


def train(net: Decoder, plan: Plan, plan_layout: ParallelLayout, args: argparse.Namespace, rank: int,
          distributed: bool, log) -> tuple[list[float], list[float]]:
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=args.lr, beta1=0.9, beta2=0.95, weight_decay=0.1)
    if distributed and uses_semi_auto():
        return _train_semi_auto(semi_auto_step(net, plan_layout, optimizer), plan, args, log)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters) if distributed else None
    dp, m = plan_layout.dp, plan_layout.micro_batch_num
    losses, step_times = [], []
    for step in range(args.steps):
        rows = np.array_split(batch(step, plan, args), dp)[rank % dp]
        start = time.perf_counter()
        total, grads_sum = 0.0, None
        for tokens in np.array_split(rows, m):
            loss, grads = grad_fn(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]))
            grads_sum = grads if grads_sum is None else tuple(a + b for a, b in zip(grads_sum, grads))
            total += float(loss) / m
        grads = tuple(g / m for g in grads_sum)
        if reducer is not None:
            grads = reducer(grads)
        optimizer(grads)
        loss = _mean_over_ranks(total, distributed)
        step_times.append(time.perf_counter() - start)
        losses.append(loss)
        log(f"step {step + 1}/{args.steps} loss {loss:.6f} time {step_times[-1]:.3f} s")
    return losses, step_times


def _train_semi_auto(step, plan: Plan, args: argparse.Namespace, log) -> tuple[list[float], list[float]]:
    losses, step_times = [], []
    for i in range(args.steps):
        tokens = batch(i, plan, args)
        start = time.perf_counter()
        loss = float(step(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:])).asnumpy().mean())
        step_times.append(time.perf_counter() - start)
        losses.append(loss)
        log(f"step {i + 1}/{args.steps} loss {loss:.6f} time {step_times[-1]:.3f} s")
    return losses, step_times


def _mean_over_ranks(value: float, distributed: bool) -> float:
    if not distributed:
        return value
    return float(ops.AllReduce()(Tensor(np.array([value], np.float32))).asnumpy()[0]) / get_group_size()


def report(plan: Plan, args: argparse.Namespace, losses: list[float], step_times: list[float],
           distributed: bool) -> None:
    """Every rank's step times and peak memory gathered to rank 0, which writes the report."""
    rank = get_rank() if distributed else 0
    mine = np.array([_rss(), *step_times], np.float64)
    rows = _gather(mine, distributed)
    if rank != 0:
        return
    ranks = [RankReport(rank=r, stage=stage_of_rank(plan, r), step_times_s=[float(x) for x in row[1:]],
                        peak_memory_bytes=float(row[0]), memory_kind="rss") for r, row in enumerate(rows)]
    write_report(build_report(
        plan, backend="mindspore", framework_version=ms.__version__, device=ms.get_context("device_target"),
        compute_dtype="fp32", first_step=0, steps=args.steps, warmup_steps=args.warmup_steps, losses=losses,
        ranks=ranks), args.run_dir / "run_report.json")


def _gather(row: np.ndarray, distributed: bool) -> np.ndarray:
    """(ranks, len(row)): every rank's row (float32 on the wire: MindSpore's CPU AllGather)."""
    if not distributed:
        return row[None, :]
    gathered = ops.AllGather()(Tensor(row.astype(np.float32)[None, :])).asnumpy()
    return gathered.reshape(get_group_size(), -1).astype(np.float64)


def _rss() -> float:
    import resource

    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


if __name__ == "__main__":
    # A normal exit: MindSpore's scheduler counts a worker that skips finalisation as timed out.
    sys.exit(main())
