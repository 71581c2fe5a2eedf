"""A mixture-of-experts MLP and its expert parallelism, as the cost model prices them
(cost_models/experts.py): top-k routing over softmax (or sigmoid, normalised over the chosen experts)
scores, dropless; each token's k copies sorted by expert, dispatched to the ranks holding their experts
with `all_to_all_single`, computed there, sent back and summed with their routing weights; shared experts
as one dense MLP beside them.

Expert weights are stacked per matrix — `experts_w1` of shape (E, f, h) — so that expert parallelism
keeps a contiguous block of E/ep experts per rank and a checkpoint or the deterministic initialisation
see one global tensor whatever ep is (`ep_slice` says which rows a rank holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ExpertGroup:
    """The ep ranks that share one set of tokens' experts, and this rank's place among them."""

    group: object
    size: int
    rank: int


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
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # token copies in expert order
        copies = tokens[order // self.top_k]
        per_expert = torch.bincount(flat, minlength=self.n_experts)
        out = self._dispatch_compute_combine(copies, per_expert)
        combined = out[torch.argsort(order)]  # back to (token, k) order
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


def apply_ep(model: nn.Module, group: ExpertGroup) -> None:
    """Keep this rank's E/ep experts of every MoE layer (on the meta device, before materialising)."""
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        module.ep = group
        block = module.n_experts // group.size
        for name in EXPERT_PARAMS:
            full = getattr(module, name)
            if full is None:
                continue
            setattr(module, name, nn.Parameter(full[group.rank * block:(group.rank + 1) * block].detach().clone()))


def is_expert_param(name: str) -> bool:
    """Parameter names survive materialising (`to_empty` makes new Parameter objects); attributes do not."""
    return name.rsplit(".", 1)[-1] in EXPERT_PARAMS


def expert_rows(model: nn.Module, name: str) -> tuple[int, int, tuple[int, ...]] | None:
    """(first expert, experts, full shape) of an expert parameter this rank holds a block of; None for
    any other parameter."""
    if not is_expert_param(name):
        return None
    module = model.get_submodule(name.rsplit(".", 1)[0])
    param = getattr(module, name.rsplit(".", 1)[1])
    rank = module.ep.rank if module.ep is not None else 0
    block = param.shape[0]
    return rank * block, block, (module.n_experts, *param.shape[1:])
