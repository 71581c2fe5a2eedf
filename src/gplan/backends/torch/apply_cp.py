"""Context parallelism: the sequence split over the cp group, attention as a ring.

Load balance (Megatron's causal split): the sequence is cut into 2·cp chunks and cp rank r holds chunks
r and 2·cp − 1 − r, so every rank has the same share of the causal triangle. Every token keeps its
global position (RoPE angles, learned positions, the causal mask).

Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): each rank keeps its
queries and passes its keys and values round the cp group; at every one of the cp steps it attends to
the block it holds, folding the block into its output with the online softmax (running max m, running
sum l; Milakov & Gimelshein 2018), then sends the block on while receiving the next. The backward
walks the ring again, recomputing each block's probabilities from the saved log-sum-exp, and passes
each block's key and value gradients along with it, so after cp steps they are back with their owner.
Keys and values travel with their kv heads only (GQA is expanded inside each block), as the cost model
prices them (`StepModel.layer_cp_comm_s`).

torch's own `context_parallel` has no sharding rule for CPU attention; this one runs on gloo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ring:
    """A rank's place in its cp group."""

    group: object
    ranks: list[int]
    """Global ranks of the cp group, in cp order."""
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def next(self) -> int:
        return self.ranks[(self.index + 1) % self.size]

    @property
    def prev(self) -> int:
        return self.ranks[(self.index - 1) % self.size]


def load_balanced_positions(seq: int, cp: int, index: int) -> torch.Tensor:
    """The global positions cp rank `index` holds: chunks `index` and `2·cp − 1 − index` of 2·cp."""
    if seq % (2 * cp):
        # the plan check refuses such a plan first (spec.parallel's cp rule): this is a caller's error
        raise ValueError(f"load_balanced_positions: seq {seq} over 2·cp = {2 * cp} chunks")
    chunk = seq // (2 * cp)
    first, second = index * chunk, (2 * cp - 1 - index) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])


def apply_cp(model, ring: Ring, seq: int) -> None:
    """Give every attention of a model chunk the ring, and the chunk its tokens' global positions."""
    model.positions = load_balanced_positions(seq, ring.size, ring.index)
    for block in model.layers.values():
        block.attention.ring = ring
        block.attention.positions = model.positions


def ring_pass(tensors: list[torch.Tensor], ring: Ring) -> list[torch.Tensor]:
    """Send `tensors` to the next rank, receive the previous rank's (same shapes)."""
    tensors = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in tensors]
    ops = []
    for t, r in zip(tensors, received):
        ops += [dist.P2POp(dist.isend, t, ring.next, ring.group),
                dist.P2POp(dist.irecv, r, ring.prev, ring.group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


def _scores(q, k, pos_q, pos_k, scale: float) -> torch.Tensor:
    """Causal scores of one block: (b, h, sq, sk), −inf where the key comes after the query."""
    groups = q.shape[1] // k.shape[1]
    s = (q @ k.repeat_interleave(groups, dim=1).transpose(-1, -2)) * scale
    return s.masked_fill(pos_k[None, None, None, :] > pos_q[None, None, :, None], float("-inf"))


def _fold_kv_grad(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of the expanded (per query head) keys or values, summed back to the kv heads."""
    b, h, s, d = grad.shape
    return grad.view(b, kv_heads, h // kv_heads, s, d).sum(2)


class RingAttention(torch.autograd.Function):
    """softmax(QKᵀ/√d, causal by global position) V over the whole cp group; q (b, h, s, d), k and v
    (b, h_kv, s, d), all local."""

    @staticmethod
    def forward(ctx, q, k, v, positions, ring):
        scale = q.shape[-1] ** -0.5
        qf = q.float()
        out = torch.zeros_like(qf)
        row_max = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        row_sum = torch.zeros(q.shape[:-1], dtype=torch.float32, device=q.device)
        block = [k.float(), v.float(), positions]
        for step in range(ring.size):
            kb, vb, pos_k = block
            s = _scores(qf, kb, positions, pos_k, scale)
            new_max = torch.maximum(row_max, s.amax(-1))
            p = torch.exp(s - new_max[..., None])
            correction = torch.exp(row_max - new_max)
            row_sum = row_sum * correction + p.sum(-1)
            out = out * correction[..., None] + p @ vb.repeat_interleave(q.shape[1] // kb.shape[1], dim=1)
            row_max = new_max
            if step + 1 < ring.size:
                block = ring_pass(block, ring)
        out = out / row_sum[..., None]
        lse = row_max + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, positions, out, lse)
        ctx.ring = ring
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, positions, out, lse = ctx.saved_tensors
        ring = ctx.ring
        scale = q.shape[-1] ** -0.5
        qf, do = q.float(), grad_out.float()
        delta = (do * out).sum(-1)
        dq = torch.zeros_like(qf)
        kv_heads = k.shape[1]
        groups = q.shape[1] // kv_heads
        block = [k.float(), v.float(), positions, torch.zeros_like(k, dtype=torch.float32),
                 torch.zeros_like(v, dtype=torch.float32)]
        for step in range(ring.size):
            kb, vb, pos_k, dk, dv = block
            p = torch.exp(_scores(qf, kb, positions, pos_k, scale) - lse[..., None])
            ke, ve = kb.repeat_interleave(groups, dim=1), vb.repeat_interleave(groups, dim=1)
            dv = dv + _fold_kv_grad(p.transpose(-1, -2) @ do, kv_heads)
            ds = p * (do @ ve.transpose(-1, -2) - delta[..., None])
            dq = dq + (ds @ ke) * scale
            dk = dk + _fold_kv_grad((ds.transpose(-1, -2) @ qf) * scale, kv_heads)
            block = ring_pass([kb, vb, pos_k, dk, dv], ring) if step + 1 < ring.size else [kb, vb, pos_k, dk, dv]
        # The block held now is the one before this rank's; one more pass brings its gradients home.
        dk, dv = ring_pass(block[3:], ring) if ring.size > 1 else block[3:]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, ring: Ring):
    return RingAttention.apply(q, k, v, positions, ring)
