"""A mixture-of-experts MLP and its expert parallelism, as the cost model prices them
(cost_models/experts.py): top-k routing over softmax (or sigmoid, normalised over the chosen experts)
scores, dropless; each token's k copies sorted by expert, dispatched to the ranks holding their experts
with `all_to_all_single`, computed there, sent back and summed with their routing weights; shared experts
as one dense MLP beside them.

Expert weights are stacked per matrix — `experts_w1` of shape (E, f, h) — so that expert parallelism
keeps a contiguous block of E/ep experts per rank and a checkpoint or the deterministic initialisation
see one global tensor whatever ep is (`expert_slice` says which block a rank holds).

Expert tensor parallelism (etp) splits every expert's width f over the etp ranks, as Megatron's
`--expert-tensor-parallel-size` does: the etp ranks (innermost in the expert grid etp × ep × edp) gather
their tokens, route them alike, dispatch them over ep, each computes its width-slice of the experts, and
the partial outputs are summed back to the tokens' own ranks (an all-reduce and the own slice: gloo has no
reduce-scatter) before the routing weights combine them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ExpertGroup:
    """The ep ranks that share one set of tokens' experts, and this rank's place among them; with etp,
    the ranks that split those experts' width."""

    group: object
    size: int
    rank: int
    tp_group: object = None
    tp_size: int = 1
    tp_rank: int = 0


class _GatherTokens(torch.autograd.Function):
    """All-gather over the etp group along rows; backward: the summed gradient's own rows."""

    @staticmethod
    def forward(ctx, x, group, size, rank):
        ctx.group, ctx.size, ctx.rank, ctx.rows = group, size, rank, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows], None, None, None


class _SumToOwnRows(torch.autograd.Function):
    """Sum partial outputs over the etp group and keep this rank's rows; backward: the rows' gradient
    placed back in the gathered layout (each rank's partial output fed the same sum)."""

    @staticmethod
    def forward(ctx, y, group, size, rank):
        ctx.group, ctx.size, ctx.rank = group, size, rank
        total = y.contiguous().clone()
        dist.all_reduce(total, group=group)
        rows = y.shape[0] // size
        return total[rank * rows:(rank + 1) * rows]

    @staticmethod
    def backward(ctx, grad):
        # every rank's rows of the gathered output take their owner's gradient: gather them
        parts = [torch.empty_like(grad) for _ in range(ctx.size)]
        dist.all_gather(parts, grad.contiguous(), group=ctx.group)
        return torch.cat(parts), None, None, None


class MoE(nn.Module):
    def __init__(self, dim: int, n_experts: int, top_k: int, ffn_dim: int, ffn_kind: str, router: str,
                 shared: nn.Module | None):
        super().__init__()
        self.n_experts, self.top_k, self.kind, self.router_kind = n_experts, top_k, ffn_kind, router
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts_w1 = nn.Parameter(torch.empty(n_experts, ffn_dim, dim))
        self.experts_w2 = nn.Parameter(torch.empty(n_experts, dim, ffn_dim))
        self.experts_w3 = nn.Parameter(torch.empty(n_experts, ffn_dim, dim)) if ffn_kind == "swiglu" else None
        self.shared = shared
        self.ep: ExpertGroup | None = None
        """Expert parallelism (apply_ep): this rank holds experts [rank·E/ep, (rank+1)·E/ep)."""

    @property
    def local_experts(self) -> int:
        return self.experts_w1.shape[0]

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each (tokens, k): the top-k of softmax scores, or of sigmoid scores
        renormalised over the chosen k (DeepSeek-V3; its per-expert selection bias, updated outside the
        gradient from the expert loads, is left out: routing here is the scores' own)."""
        logits = self.router(tokens).float()
        if self.router_kind == "sigmoid":
            weights, ids = torch.topk(torch.sigmoid(logits), self.top_k, dim=-1)
            weights = weights / weights.sum(-1, keepdim=True)
        else:
            weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        return weights.type_as(tokens), ids

    def expert(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert j on its rows."""
        up = x @ self.experts_w1[j].t()
        if self.kind == "swiglu":
            hidden = F.silu(up) * (x @ self.experts_w3[j].t())
        else:
            hidden = (F.gelu if self.kind == "gelu" else F.relu)(up)
        return hidden @ self.experts_w2[j].t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, ids = self.route(tokens)
        routed, routed_ids = tokens, ids
        etp = self.ep is not None and self.ep.tp_size > 1
        if etp:  # the etp ranks route the same (gathered) tokens, each with its slice of every expert
            e = self.ep
            routed = _GatherTokens.apply(tokens, e.tp_group, e.tp_size, e.tp_rank)
            gathered = [torch.empty_like(ids) for _ in range(e.tp_size)]
            dist.all_gather(gathered, ids.contiguous(), group=e.tp_group)
            routed_ids = torch.cat(gathered)
        flat = routed_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # token copies in expert order
        copies = routed[order // self.top_k]
        per_expert = torch.bincount(flat, minlength=self.n_experts)
        out = self._dispatch_compute_combine(copies, per_expert)
        combined = out[torch.argsort(order)]  # back to (token, k) order
        if etp:  # partial sums over the width slices, back to this rank's own tokens
            combined = _SumToOwnRows.apply(combined, e.tp_group, e.tp_size, e.tp_rank)
        y = (combined.view(-1, self.top_k, shape[-1]) * weights.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            y = y + self.shared(tokens)
        return y.view(shape)

    def _dispatch_compute_combine(self, copies: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        if self.ep is None or self.ep.size == 1:
            return self._compute(copies, per_expert.view(1, -1))
        from torch.distributed.nn.functional import all_to_all_single

        ep, local = self.ep, self.local_experts
        send_counts = per_expert.view(ep.size, local)           # rows for each rank's experts, in order
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=ep.group)  # what each source sends me
        send_splits, recv_splits = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
        received = all_to_all_single(copies.new_empty(sum(recv_splits), copies.shape[-1]), copies,
                                     recv_splits, send_splits, group=ep.group)
        computed = self._compute(received, recv_counts)
        return all_to_all_single(copies.new_empty(copies.shape), computed, send_splits, recv_splits, group=ep.group)

    def _compute(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """rows grouped by source, then by local expert (counts: sources × local experts)."""
        pieces, start = [], 0
        for source in counts.tolist():
            for j, n in enumerate(source):
                pieces.append(self.expert(j, rows[start:start + n]))
                start += n
        return torch.cat(pieces) if pieces else rows


EXPERT_PARAMS = ("experts_w1", "experts_w2", "experts_w3")


WIDTH_AXIS = {"experts_w1": 1, "experts_w3": 1, "experts_w2": 2}
"""The axis of each stacked expert matrix that runs along the expert's width f (split by etp)."""


def apply_ep(model: nn.Module, group: ExpertGroup) -> None:
    """Keep this rank's E/ep experts of every MoE layer, and with etp its slice of their width (on the
    meta device, before materialising)."""
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        module.ep = group
        for name in EXPERT_PARAMS:
            full = getattr(module, name)
            if full is not None:
                setattr(module, name, nn.Parameter(full[_block(full.shape, name, group)].detach().clone()))


def _block(shape, name: str, group: ExpertGroup | None) -> tuple[slice, ...]:
    """The index of this rank's block of a stacked expert matrix of `shape` (the full one)."""
    if group is None:
        return tuple(slice(None) for _ in shape)
    experts = shape[0] // group.size
    index = [slice(group.rank * experts, (group.rank + 1) * experts), slice(None), slice(None)]
    width = shape[WIDTH_AXIS[name]] // group.tp_size
    index[WIDTH_AXIS[name]] = slice(group.tp_rank * width, (group.tp_rank + 1) * width)
    return tuple(index)


def is_expert_param(name: str) -> bool:
    """Parameter names survive materialising (`to_empty` makes new Parameter objects); attributes do not."""
    return name.rsplit(".", 1)[-1] in EXPERT_PARAMS


def expert_slice(model: nn.Module, name: str) -> tuple[tuple[int, ...], tuple[slice, ...]] | None:
    """(full shape, this rank's index into it) of an expert parameter — experts over ep, width over etp;
    None for any other parameter."""
    if not is_expert_param(name):
        return None
    path, _, attribute = name.rpartition(".")
    module = model.get_submodule(path)
    param, group = getattr(module, attribute), module.ep
    shape = list(param.shape)
    if group is not None:
        shape[0] *= group.size
        shape[WIDTH_AXIS[attribute]] *= group.tp_size
    return tuple(shape), _block(shape, attribute, group)
