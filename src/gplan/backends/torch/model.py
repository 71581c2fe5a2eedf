"""The decoder-only transformer of a ModelSpec (GPT and Llama families), written so that a pipeline
stage is the same module with the layers it does not run deleted and its missing ends set to None.

Parameter names are global (`layers.17.attention.wq.weight`) whatever the layout, so checkpoints and
the deterministic initialisation do not depend on dp/tp/pp. Attention infers its local head count
from the projected width, so tensor parallelism only has to shard the weights.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gplan.spec.model import ModelSpec

INIT_STD = 0.02
"""GPT-2/Megatron initialisation: N(0, 0.02) for every weight matrix."""


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    ffn_kind: str
    vocab_size: int
    max_seq_len: int
    norm: str
    position: str
    tie_embeddings: bool
    bias: bool
    qkv_bias: bool = False
    """Biases on q, k and v only (Qwen2); `bias` puts them on every linear layer."""
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    head_dim: int = 0
    """Width of one head; 0: dim / n_heads."""
    n_experts: int = 0
    """Routed experts of each MoE layer (0: dense)."""
    top_k: int = 0
    moe_ffn_dim: int = 0
    shared_ffn_dim: int = 0
    first_dense: int = 0
    """Leading layers with a dense MLP."""
    router: str = "softmax"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    """> 0: multi-head latent attention (head_dim is then the non-rotary query/key width)."""
    rope_dim: int = 0
    """Rotary width of a head: head_dim, or MLA's qk_rope_head_dim."""
    v_head_dim: int = 0

    @classmethod
    def from_spec(cls, spec: ModelSpec, seq_length: int) -> "ModelArgs":
        if spec.num_encoder_layers:
            raise ValueError("the torch worker runs decoder-only models")
        if spec.position_embedding not in ("rope", "learned"):
            raise ValueError(f"position embedding {spec.position_embedding!r}: the torch worker runs rope or learned")
        latent = dict(q_lora_rank=spec.q_lora_rank or 0, kv_lora_rank=spec.kv_lora_rank,
                      rope_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim or spec.kv_channels) if spec.is_mla else {}
        experts = dict(n_experts=spec.num_experts, top_k=spec.top_k, moe_ffn_dim=spec.expert_ffn_size,
                       shared_ffn_dim=spec.shared_expert_ffn_size, first_dense=spec.first_dense_layers,
                       router=spec.router) if spec.is_moe else {}
        return cls(dim=spec.hidden_size, n_layers=spec.num_layers, n_heads=spec.num_attention_heads,
                   n_kv_heads=spec.kv_heads, ffn_dim=spec.ffn_size, ffn_kind=spec.ffn_kind,
                   vocab_size=spec.vocab_size, max_seq_len=seq_length, norm=spec.norm,
                   position=spec.position_embedding, tie_embeddings=spec.tie_embeddings, bias=spec.bias,
                   qkv_bias=spec.qkv_bias,
                   rope_theta=spec.rope_theta, head_dim=spec.kv_channels, **experts, **latent)

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if not self.rope_dim:
            object.__setattr__(self, "rope_dim", self.head_dim)


def make_norm(args: ModelArgs) -> nn.Module:
    if args.norm == "rmsnorm":
        return nn.RMSNorm(args.dim, eps=args.norm_eps)
    return nn.LayerNorm(args.dim, eps=args.norm_eps, bias=args.bias)


def rope_tables(seq_len: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoPE (Su et al. 2021) for positions 0..seq_len−1, shape (seq, head_dim/2)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of every head; x is (batch, seq, heads, head_dim)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        q_dim, kv_dim = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        qkv_bias = args.bias or args.qkv_bias
        self.wq = nn.Linear(args.dim, q_dim, bias=qkv_bias)
        self.wk = nn.Linear(args.dim, kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(args.dim, kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(q_dim, args.dim, bias=args.bias)
        self.recompute_core = False
        """Selective recomputation: keep only the inputs of softmax(QKᵀ)V for the backward."""
        self.ring = None
        """Context parallelism (apply_cp): the cp group the keys and values go round."""
        self.positions: torch.Tensor | None = None
        """With cp: the global positions of this rank's tokens."""

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        hd = self.args.head_dim
        q = self.wq(x).view(batch, seq, -1, hd)
        k = self.wk(x).view(batch, seq, -1, hd)
        v = self.wv(x).view(batch, seq, -1, hd)
        if rope is not None:
            cos, sin = rope[0][:seq], rope[1][:seq]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.ring is not None:
            from gplan.backends.torch.apply_cp import ring_attention

            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            args = (q, k, v, self.positions.to(q.device), self.ring)
            if self.recompute_core and torch.is_grad_enabled():
                out = checkpoint(ring_attention, *args, use_reentrant=False)
            else:
                out = ring_attention(*args)
            return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        groups = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(F.scaled_dot_product_attention, q, k, v, None, 0.0, True, use_reentrant=False)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2 §2.1): queries through a rank-r_q bottleneck (or directly),
    keys and values from one rank-r_kv latent, each head's query/key a non-rotary part and a rotary part
    (the key's rotary part one vector shared by every head), values of their own width. Its parameters
    are `ModelSpec.latent_attention_params`' (the worker runs it at tp = cp = 1)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        h, a, nope, rope, v = args.dim, args.n_heads, args.head_dim, args.rope_dim, args.v_head_dim
        if args.q_lora_rank:
            self.wq_a = nn.Linear(h, args.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(args.q_lora_rank, eps=args.norm_eps)
            self.wq_b = nn.Linear(args.q_lora_rank, a * (nope + rope), bias=False)
        else:
            self.wq = nn.Linear(h, a * (nope + rope), bias=False)
        self.wkv_a = nn.Linear(h, args.kv_lora_rank + rope, bias=False)
        self.kv_norm = nn.RMSNorm(args.kv_lora_rank, eps=args.norm_eps)
        self.wkv_b = nn.Linear(args.kv_lora_rank, a * (nope + v), bias=False)
        self.wo = nn.Linear(a * v, h, bias=False)
        self.recompute_core = False

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        args = self.args
        batch, seq, _ = x.shape
        a, nope, r, v = args.n_heads, args.head_dim, args.rope_dim, args.v_head_dim
        q = self.wq_b(self.q_norm(self.wq_a(x))) if args.q_lora_rank else self.wq(x)
        q_nope, q_rot = q.view(batch, seq, a, nope + r).split([nope, r], dim=-1)
        latent, k_rot = self.wkv_a(x).split([args.kv_lora_rank, r], dim=-1)
        k_nope, values = self.wkv_b(self.kv_norm(latent)).view(batch, seq, a, nope + v).split([nope, v], dim=-1)
        cos, sin = rope[0][:seq], rope[1][:seq]
        q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot.unsqueeze(2), cos, sin)
        q = torch.cat([q_nope, q_rot], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rot.expand(-1, -1, a, -1)], dim=-1).transpose(1, 2)
        values = values.transpose(1, 2)
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(F.scaled_dot_product_attention, q, k, values, None, 0.0, True, use_reentrant=False)
        else:
            out = F.scaled_dot_product_attention(q, k, values, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, a * v))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, width: int | None = None):
        super().__init__()
        self.kind = args.ffn_kind
        width = width or args.ffn_dim
        self.w1 = nn.Linear(args.dim, width, bias=args.bias)
        self.w2 = nn.Linear(width, args.dim, bias=args.bias)
        self.w3 = nn.Linear(args.dim, width, bias=args.bias) if self.kind == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        act = F.gelu if self.kind == "gelu" else F.relu
        return self.w2(act(self.w1(x)))


def make_mlp(args: ModelArgs, layer_id: int) -> nn.Module:
    """A dense MLP, or past the leading dense layers of a mixture of experts its router and experts."""
    if not args.n_experts or layer_id < args.first_dense:
        return FeedForward(args)
    from gplan.backends.torch.moe import MoE

    shared = FeedForward(args, args.shared_ffn_dim) if args.shared_ffn_dim else None
    return MoE(args.dim, args.n_experts, args.top_k, args.moe_ffn_dim, args.ffn_kind, args.router, shared)


def _per_op_saved() -> set:
    """The ops whose outputs the per-op policy keeps: those of torchtitan 0.3.0's `_get_default_save_ops` that
    this model runs — torch's compute-intensive ops (mm, addmm, bmm, _scaled_mm, attention;
    `get_default_op_list`), linear, and the reduce-scatter and all-to-all collectives — and the CPU flash kernel
    (attention on CPU)."""
    from torch._functorch.partitioners import get_default_op_list

    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    ops |= {torch.ops.aten.linear.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default,
            torch.ops._c10d_functional.all_to_all_single.default}
    return ops


MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)


def per_op_contexts():
    """A fresh per-op policy for one block's forward and its replay: kept ops' outputs are saved, except every
    second matmul (counted apart in the forward and in the replay, so both make the same choice)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved, count = _per_op_saved(), {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func in MATMULS:
            run = "recompute" if ctx.is_recompute else "forward"
            count[run] += 1
            if count[run] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int = 0):
        super().__init__()
        self.attention_norm = make_norm(args)
        self.attention = LatentAttention(args) if args.kv_lora_rank else Attention(args)
        self.ffn_norm = make_norm(args)
        self.feed_forward = make_mlp(args, layer_id)
        self.recompute_full = False
        """Full recomputation: keep only the block's input for the backward."""
        self.recompute_per_op = False
        """torchtitan's per-operator policy (the recompute module `op`): keep every other matmul's output,
        attention's and the collectives', replay the rest (`per_op_contexts`)."""

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        if self.recompute_full and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        if self.recompute_per_op and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False, context_fn=per_op_contexts)
        return self._forward(x, rope)

    def _forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Token ids in, logits out; a pipeline stage takes or returns hidden states where an end is None."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Module | None = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings: nn.Module | None = (
            nn.Embedding(args.max_seq_len, args.dim) if args.position == "learned" else None)
        self.embed_out = nn.Identity()
        """Where tensor parallelism shards the sequence after learned positions are added."""
        self.layers = nn.ModuleDict({str(i): Block(args, i) for i in range(args.n_layers)})
        self.norm: nn.Module | None = make_norm(args)
        self.output: nn.Module | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.positions: torch.Tensor | None = None
        """With cp (apply_cp): the global positions of this rank's tokens; else 0..seq−1."""
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the head; again after `to_empty` and tensor parallelism, which
        both replace parameters one module at a time."""
        if self.args.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        positions = self.positions.to(x.device) if self.positions is not None else torch.arange(seq, device=x.device)
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(positions)
            h = self.embed_out(h)
        else:
            h = x
        rope = None
        if self.args.position == "rope":
            # Under sequence parallelism hidden states hold seq/tp positions; attention sees them all.
            cos, sin = rope_tables(self.args.max_seq_len, self.args.rope_dim, self.args.rope_theta, h.device)
            rope = (cos[positions], sin[positions]) if self.positions is not None else (cos, sin)
        for block in self.layers.values():
            h = block(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def keep_stage(model: Transformer, layer_ids: list[int], first: bool, last: bool) -> Transformer:
    """Cut `model` down to one pipeline stage (chunk): its layers, the embedding if first, the final
    norm and head if last."""
    for name in list(model.layers.keys()):
        if int(name) not in layer_ids:
            del model.layers[name]
    if not first:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


def initial_value(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The full initial value of parameter `name`, the same on every rank and in every layout:
    ones for norm weights, zeros for biases, N(0, INIT_STD) else, from a generator seeded by the
    name. A tied model's head on its own stage draws the embedding's value (callers pass its name)."""
    if name.endswith("bias"):
        return torch.zeros(shape)
    if "norm" in name:
        return torch.ones(shape)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=generator) * INIT_STD


def init_weights(model: nn.Module, seed: int) -> None:
    """Fill every parameter (plain, tp-sharded or FSDP-sharded) with its slice of `initial_value`."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from gplan.backends.torch.moe import expert_slice

    tied = getattr(getattr(model, "args", None), "tie_embeddings", False)
    with torch.no_grad():
        for name, param in model.named_parameters():
            block = expert_slice(model, name)
            if tied and name == "output.weight":  # the head's copy of the embedding on the last stage
                name = "tok_embeddings.weight"
            if block is not None:  # this rank's block of the stacked experts (ep; their width over etp)
                shape, index = block
                param.copy_(initial_value(name, torch.Size(shape), seed)[index])
                continue
            full = initial_value(name, param.shape, seed).to(device=param.device, dtype=param.dtype)
            if isinstance(param, DTensor):
                local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
                param.to_local().copy_(local)
            else:
                param.copy_(full)

