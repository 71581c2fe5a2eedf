"""Time the model's parts with MindSpore (PyNative; Ascend when present, else CPU), with the
MindSpore worker's own cells: a decoder layer as one tp rank holds it, its attention core, the head
(norm, logits over vocab/tp, cross-entropy) and the embedding; forward, backward and backward with
full recomputation, the median of repeats after warm-up. MindSpore has no saved-tensor hook, so
activation bytes stay unmeasured (the cost model's formula stands). The results are the torch
measurer's `LayerMeasurement`s, so profiles from either feed the cost model alike."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

from gplan.backends.protocol import JobRecipe

from gplan.backends.recipes import MSRUN_PORT, msrun_argv
from gplan.backends.mindspore.device import has_ascend
from gplan.backends.mindspore.strategy import strategies
from gplan.backends.mindspore.worker import Block, Linear, RMSNorm, WeightInit
from gplan.profiles.shapes import measure_all, pending
from gplan.profiles.schema import LayerMeasurement
from gplan.spec.model import ModelSpec


def set_device(device: str) -> str:
    """Ascend when present (unless --device cpu), else CPU; PyNative, so every call runs when made."""
    target = "Ascend" if device != "cpu" and has_ascend() else "CPU"
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target=target)
    return target


def timed(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        _wait(fn())
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        _wait(fn())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _wait(result) -> None:
    """Block until every queued operation has run: PyNative launches asynchronously, and reading
    back the loss alone would leave the gradients still computing."""
    del result
    ms.runtime.synchronize()


def measure_shapes(spec: ModelSpec, seq_length: int, precision: str, mbs_list: list[int], tp_list: list[int],
                   warmup: int = 3, repeats: int = 5, done: set[tuple] | None = None,
                   on_result: Callable[[LayerMeasurement], None] | None = None) -> list[LayerMeasurement]:
    return measure_all(pending(spec, seq_length, precision, mbs_list, tp_list, done),
                       lambda shape: _measure_one(shape, spec, warmup, repeats), on_result)


def _measure_one(shape: LayerMeasurement, spec: ModelSpec, warmup: int, repeats: int) -> LayerMeasurement:
    try:
        measure = {"layer": _layer, "head": _head, "embedding": _embedding}[shape.part]
        return shape.model_copy(update=measure(shape, spec, warmup, repeats))
    except (RuntimeError, MemoryError) as exc:
        if "memory" not in str(exc).lower():
            raise
        return shape.model_copy(update={"status": "oom"})


def _forward_backward(cell: nn.Cell, inputs: tuple, warmup: int, repeats: int) -> tuple[float, float]:
    grad = ms.value_and_grad(lambda *xs: cell(*xs).sum(), grad_position=0, weights=cell.trainable_params())
    forward_s = timed(lambda: cell(*inputs), warmup, repeats)
    total_s = timed(lambda: grad(*inputs), warmup, repeats)
    return forward_s, max(total_s - forward_s, 0.0)


def _layer(base: LayerMeasurement, spec: ModelSpec, warmup: int, repeats: int) -> dict:
    block = Block(spec, 0, WeightInit(0), strategies(1, 1, False), base.seq_length, tp_shard=base.tp)
    shape = (base.mbs, base.seq_length, spec.hidden_size)
    x = Tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    forward_s, backward_s = _forward_backward(block, (x,), warmup, repeats)
    q = Tensor(np.ones((base.mbs, spec.num_attention_heads // base.tp, base.seq_length, spec.kv_channels), np.float32))
    scores, softmax, context = ops.BatchMatMul(transpose_b=True), ops.Softmax(-1), ops.BatchMatMul()
    attention_s = timed(lambda: context(softmax(scores(q, q) + block.mask), q), warmup, repeats)
    block.recompute()
    _, recompute_s = _forward_backward(block, (x,), warmup, repeats)
    return {"forward_s": forward_s, "backward_s": backward_s, "attention_forward_s": attention_s,
            "backward_full_recompute_s": recompute_s}


class _Head(nn.Cell):
    def __init__(self, spec: ModelSpec, tp: int, tokens: int):
        super().__init__()
        self.norm = RMSNorm(spec.hidden_size, "norm.weight", WeightInit(0), ((1, 1, 1),))
        self.output = Linear(spec.hidden_size, spec.vocab_size // tp, "output.weight", WeightInit(0), ((1, 1), (1, 1)))
        self.loss = nn.CrossEntropyLoss()
        self.targets = Tensor(np.zeros(tokens, np.int32))

    def construct(self, x):
        logits = self.output(self.norm(x))
        return self.loss(logits.reshape(-1, logits.shape[-1]), self.targets)


def _head(base: LayerMeasurement, spec: ModelSpec, warmup: int, repeats: int) -> dict:
    head = _Head(spec, base.tp, base.mbs * base.seq_length)
    x = Tensor(np.ones((base.mbs, base.seq_length, spec.hidden_size), np.float32))
    forward_s, backward_s = _forward_backward(head, (x,), warmup, repeats)
    return {"forward_s": forward_s, "backward_s": backward_s}


class _Embedding(nn.Cell):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.table = ms.Parameter(Tensor(np.ones((vocab, hidden), np.float32)), name="tok_embeddings.weight")
        self.gather = ops.Gather()

    def construct(self, tokens):
        return self.gather(self.table, tokens, 0)


def _embedding(base: LayerMeasurement, spec: ModelSpec, warmup: int, repeats: int) -> dict:
    cell = _Embedding(spec.vocab_size // base.tp, spec.hidden_size)
    tokens = Tensor(np.zeros((base.mbs, base.seq_length), np.int32))
    forward_s = timed(lambda: cell(tokens), warmup, repeats)
    grad = ms.value_and_grad(lambda t: cell(t).sum(), grad_position=None, weights=cell.trainable_params())
    total_s = timed(lambda: grad(tokens), warmup, repeats)
    return {"forward_s": forward_s, "backward_s": max(total_s - forward_s, 0.0)}


# ---- what `gplan profile` is handed (calibration.profile.Measurer) -------------------------------

class MindSporeMeasurer:
    framework = "mindspore"

    def detect(self, device: str) -> tuple[str, str]:
        target = set_device(device)
        return target, "ascend-910b" if target == "Ascend" else "cpu"

    def measure_shapes(self, spec, seq_length, precision, mbs_list, tp_list, device, done, on_result) -> None:
        measure_shapes(spec, seq_length, precision, mbs_list, tp_list, done=done, on_result=on_result)

    def link_job(self, out, workdir, nproc, nnodes, node_rank, rdzv_endpoint, max_bytes) -> list[str]:
        script = importlib.util.find_spec("gplan.backends.mindspore.measure_links").origin
        job = JobRecipe(nnodes, nproc, [script, "--out", str(out), "--max-bytes", str(max_bytes),
                                        "--scope", "inter" if nnodes > 1 else "intra"])
        host, _, port = (rdzv_endpoint or f"127.0.0.1:{MSRUN_PORT}").rpartition(":")
        argv = msrun_argv(job, str(node_rank), host, port, Path(workdir) / "msrun_log")
        return [str(Path(sys.executable).with_name("msrun")), *argv[1:]]
