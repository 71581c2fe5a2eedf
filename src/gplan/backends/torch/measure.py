"""Time the model's parts as one tp rank runs them, with the torch worker's own modules.

For every micro-batch size and tp shard width: a decoder layer (heads, kv heads and MLP width
divided by tp; hidden and sequence whole), its attention core alone, the head (final norm, logits
over vocab/tp, cross-entropy) and the embedding. Forward and backward (without, and with full
recomputation) are timed after warm-up as the median of repeats; the activation bytes are what the
forward saves for the backward (saved-tensor hooks). A shape that runs out of memory is recorded
as `oom`, not raised.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

from gplan.backends.protocol import JobRecipe

from gplan.backends.recipes import torchrun_argv
from gplan.backends.torch.model import Block, ModelArgs, make_norm, rope_tables
from gplan.profiles.shapes import measure_all, pending
from gplan.profiles.schema import LayerMeasurement
from gplan.spec.model import ModelSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def sharded_block(args: ModelArgs, tp: int, bias: bool) -> Block:
    """A decoder layer as one of `tp` ranks holds it: the column-split projections (q, k, v, MLP up)
    and the row-split ones (attention out, MLP down) at 1/tp of their width; the head size is kept,
    so attention runs heads/tp heads."""
    block = Block(args)
    kv_dim = args.n_kv_heads * args.head_dim
    attention, mlp = block.attention, block.feed_forward
    attention.wq = torch.nn.Linear(args.dim, args.dim // tp, bias=bias)
    attention.wk = torch.nn.Linear(args.dim, kv_dim // tp, bias=bias)
    attention.wv = torch.nn.Linear(args.dim, kv_dim // tp, bias=bias)
    attention.wo = torch.nn.Linear(args.dim // tp, args.dim, bias=bias)
    mlp.w1 = torch.nn.Linear(args.dim, args.ffn_dim // tp, bias=bias)
    mlp.w2 = torch.nn.Linear(args.ffn_dim // tp, args.dim, bias=bias)
    if mlp.w3 is not None:
        mlp.w3 = torch.nn.Linear(args.dim, args.ffn_dim // tp, bias=bias)
    return block


def timed(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def saved_bytes(fn: Callable[[], torch.Tensor]) -> float:
    """Bytes of the tensors autograd keeps from the forward `fn` for the backward."""
    total = 0
    seen: set[int] = set()

    def pack(tensor: torch.Tensor):
        nonlocal total
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return float(total)


def measure_shapes(spec: ModelSpec, seq_length: int, precision: str, mbs_list: list[int], tp_list: list[int],
                   device: torch.device, warmup: int = 2, repeats: int = 5, done: set[tuple] | None = None,
                   on_result: Callable[[LayerMeasurement], None] | None = None) -> list[LayerMeasurement]:
    """Every (part, tp, mbs) not in `done`, reported through `on_result` as it is measured."""
    return measure_all(pending(spec, seq_length, precision, mbs_list, tp_list, done),
                       lambda shape: _measure_one(shape, spec, device, warmup, repeats), on_result)


def _measure_one(base: LayerMeasurement, spec: ModelSpec, device: torch.device, warmup: int,
                 repeats: int) -> LayerMeasurement:
    try:
        measure = {"layer": _layer, "head": _head, "embedding": _embedding}[base.part]
        return base.model_copy(update=measure(base, spec, device, warmup, repeats))
    except torch.OutOfMemoryError:
        _free(device)
        return base.model_copy(update={"status": "oom"})
    except RuntimeError as exc:
        _free(device)
        if "out of memory" in str(exc).lower():
            return base.model_copy(update={"status": "oom"})
        raise


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _autocast(device: torch.device, precision: str):
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        return torch.autocast("cuda", dtype=DTYPES[precision])
    return torch.autocast(device.type, enabled=False)


def _forward_backward(make_output: Callable[[], torch.Tensor], device: torch.device, precision: str,
                      warmup: int, repeats: int) -> tuple[float, float]:
    """(forward, backward) medians: the forward alone, then forward + backward minus the forward."""
    def forward():
        with torch.no_grad(), _autocast(device, precision):
            make_output()

    def both():
        with _autocast(device, precision):
            out = make_output()
        out.float().sum().backward()

    forward_s = timed(forward, device, warmup, repeats)
    total_s = timed(both, device, warmup, repeats)
    return forward_s, max(total_s - forward_s, 0.0)


def _layer(base: LayerMeasurement, spec: ModelSpec, device: torch.device, warmup: int, repeats: int) -> dict:
    args = ModelArgs.from_spec(spec, base.seq_length)
    block = sharded_block(args, base.tp, spec.bias).to(device)
    x = torch.randn(base.mbs, base.seq_length, args.dim, device=device, requires_grad=True)
    rope = rope_tables(base.seq_length, args.head_dim, args.rope_theta, device) if args.position == "rope" else None
    forward_s, backward_s = _forward_backward(lambda: block(x, rope), device, base.precision, warmup, repeats)
    heads, kv = args.n_heads // base.tp, args.n_kv_heads // base.tp
    q = torch.randn(base.mbs, heads, base.seq_length, args.head_dim, device=device)
    k = torch.randn(base.mbs, kv, base.seq_length, args.head_dim, device=device).repeat_interleave(heads // kv, dim=1)

    def core():
        with torch.no_grad(), _autocast(device, base.precision):
            F.scaled_dot_product_attention(q, k, k, is_causal=True)

    attention_s = timed(core, device, warmup, repeats)
    with _autocast(device, base.precision):
        activation = saved_bytes(lambda: block(x, rope))
    block.recompute_full = True
    _, recompute_backward_s = _forward_backward(lambda: block(x, rope), device, base.precision, warmup, repeats)
    return {"forward_s": forward_s, "backward_s": backward_s, "attention_forward_s": attention_s,
            "backward_full_recompute_s": recompute_backward_s, "activation_bytes": activation}


def _head(base: LayerMeasurement, spec: ModelSpec, device: torch.device, warmup: int, repeats: int) -> dict:
    args = ModelArgs.from_spec(spec, base.seq_length)
    norm = make_norm(args).to(device)
    output = torch.nn.Linear(args.dim, args.vocab_size // base.tp, bias=False).to(device)
    x = torch.randn(base.mbs, base.seq_length, args.dim, device=device, requires_grad=True)
    targets = torch.randint(args.vocab_size // base.tp, (base.mbs * base.seq_length,), device=device)

    def run() -> torch.Tensor:
        logits = output(norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets)

    forward_s, backward_s = _forward_backward(run, device, base.precision, warmup, repeats)
    with _autocast(device, base.precision):
        activation = saved_bytes(run)
    return {"forward_s": forward_s, "backward_s": backward_s, "activation_bytes": activation}


def _embedding(base: LayerMeasurement, spec: ModelSpec, device: torch.device, warmup: int, repeats: int) -> dict:
    table = torch.nn.Embedding(spec.vocab_size // base.tp, spec.hidden_size).to(device)
    tokens = torch.randint(spec.vocab_size // base.tp, (base.mbs, base.seq_length), device=device)
    forward_s, backward_s = _forward_backward(lambda: table(tokens), device, base.precision, warmup, repeats)
    return {"forward_s": forward_s, "backward_s": backward_s, "activation_bytes": 0.0}


# ---- what `gplan profile` is handed (calibration.profile.Measurer) -------------------------------

GPU_NAMES = (("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80g"), ("v100", "v100-32g"))
"""Substring of torch.cuda.get_device_name -> catalogue hardware (an unknown GPU is priced as H100)."""


class TorchMeasurer:
    framework = "torch"

    def detect(self, device: str) -> tuple[torch.device, str]:
        if device in ("auto", "cuda") and torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower()
            entry = next((entry for key, entry in GPU_NAMES if key in name), "h100-sxm")
            return torch.device("cuda", 0), entry
        return torch.device("cpu"), "cpu"

    def measure_shapes(self, spec, seq_length, precision, mbs_list, tp_list, device, done, on_result) -> None:
        measure_shapes(spec, seq_length, precision, mbs_list, tp_list, device, done=done, on_result=on_result)

    def link_job(self, out, workdir, nproc, nnodes, node_rank, rdzv_endpoint, max_bytes) -> list[str]:
        job = JobRecipe(nnodes, nproc, ["-m", "gplan.backends.torch.measure_links", "--out", str(out),
                                        "--max-bytes", str(max_bytes)])
        rendezvous = {} if nnodes == 1 else dict(node_rank=str(node_rank), endpoint=rdzv_endpoint or "")
        return [sys.executable, "-m", "torch.distributed.run", *torchrun_argv(job, **rendezvous)[1:]]
