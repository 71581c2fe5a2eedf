"""ModelSpec: the shape of a transformer, as much as the cost model and the workers need.

Decoder-only stacks (GPT, Llama, Mistral, Qwen2, GPT-NeoX) and encoder–decoder stacks (the original
Transformer) are covered. A stack is a sequence of *layer kinds*, each repeated `count` times; the
planner places counts of identical layers on pipeline stages (docs/design.md, "Search").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gplan.io import drop_defaults


@dataclass(frozen=True)
class LayerKind:
    """One kind of repeated transformer layer."""

    name: str
    """`decoder` (causal self-attention), `encoder` (bidirectional), `cross_decoder`
    (causal self-attention plus cross-attention over the encoder output) or `moe_decoder` (causal
    self-attention and a mixture of experts)."""
    count: int
    causal: bool
    cross_attention: bool
    moe: bool = False
    """Its MLP is a router and experts (ModelSpec.num_experts) rather than one dense MLP."""


class ModelSpec(BaseModel):
    """A transformer's architecture. Unknown keys are errors: a typo must not fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Free-form name shown in tables and written into plans."""
    num_layers: int = Field(gt=0)
    """Decoder layers (all layers of a decoder-only model)."""
    num_encoder_layers: int = Field(default=0, ge=0)
    """Encoder layers of an encoder–decoder model; 0 for decoder-only."""
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads (GQA, MQA); defaults to num_attention_heads (MHA)."""
    ffn_hidden_size: int | None = Field(default=None, gt=0)
    """MLP inner size; defaults to 4 × hidden_size."""
    ffn_kind: Literal["gelu", "relu", "swiglu"] = "gelu"
    vocab_size: int = Field(gt=0)
    seq_length: int = Field(default=2048, gt=0)
    """Default training sequence length (tokens)."""
    tie_embeddings: bool = False
    """Whether the output head shares the input embedding's weights."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rope", "alibi", "sinusoidal"] = "learned"
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout probability; > 0 adds the 1-byte masks of Korthikanti et al. to activation memory."""
    bias: bool = False
    """Whether linear layers carry biases."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections only (Qwen2 and Qwen2.5; Megatron `--add-qkv-bias`);
    implied by `bias`."""
    head_dim: int | None = Field(default=None, gt=0)
    """Width of one attention head (Hugging Face `head_dim`, Megatron `--kv-channels`); defaults to
    hidden_size / num_attention_heads. Mistral-Nemo's 32 heads of 128 project 5120 to 4096."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base (Hugging Face `rope_theta`, Megatron `--rotary-base`): 10000 in the RoPE paper and
    Llama 2, 500000 in Llama 3. It changes no cost, but every engine must train with it."""

    sliding_window: int | None = Field(default=None, gt=0)
    """Sliding-window attention: each query attends to the last `sliding_window` tokens (Mistral 7B
    v0.1's 4096; Hugging Face `sliding_window`); None: full attention."""
    full_attention_every: int | None = Field(default=None, gt=1)
    """With sliding_window: every Nth layer attends fully, the N−1 before it through the window (gpt-oss's
    alternating `layer_types`, N = 2; Megatron's --window-attn-skip-freq N); None: every layer windowed."""
    attention_sinks: bool = False
    """A learned logit per head in every softmax's denominator (gpt-oss's `sinks`; Megatron's
    --softmax-type learnable): a parameter per head and layer, no cost gplan prices."""
    glu_clamp: float | None = Field(default=None, gt=0)
    """gpt-oss's gated unit: gate clamped to ≤ limit and the linear part to ±limit, `(up + 1)·g·σ(1.702·g)`
    (Hugging Face `swiglu_limit`; Megatron's --quick-geglu --glu-linear-offset 1.0
    --activation-func-clamp-value); the cost of a SwiGLU. None: the plain gated unit of ffn_kind."""

    qk_norm: bool = False
    """A norm over each head's queries and keys before RoPE (Qwen3; Hugging Face Qwen3 `q_norm`/`k_norm`)."""

    # ---- mixture of experts (Shazeer et al. 2017; GShard; Megatron-core's MoE layer) --------------------
    num_experts: int | None = Field(default=None, gt=1)
    """Routed experts of every MoE layer (Hugging Face `num_local_experts` / `num_experts` /
    `n_routed_experts`); None: a dense model."""
    top_k: int | None = Field(default=None, gt=0)
    """Experts each token is routed to (`num_experts_per_tok`); required with num_experts."""
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0)
    """One routed expert's FFN width (`moe_intermediate_size`); defaults to ffn_hidden_size (Mixtral's
    experts are full-width MLPs)."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Experts every token passes through besides its routed ones (DeepSeek `n_shared_experts`)."""
    shared_expert_ffn_hidden_size: int | None = Field(default=None, gt=0)
    """Width of the shared experts together (Qwen2-MoE `shared_expert_intermediate_size`); defaults to
    num_shared_experts × moe_ffn_hidden_size (DeepSeek's shared experts are routed-expert-sized)."""
    first_dense_layers: int = Field(default=0, ge=0)
    """Leading layers with a dense MLP of ffn_hidden_size (DeepSeek `first_k_dense_replace`); every
    later layer is an MoE layer."""
    capacity_factor: float | None = Field(default=None, gt=0)
    """Tokens an expert takes, as a multiple of its balanced share; beyond it tokens are dropped
    (GShard). None: dropless (Megatron-core's default; every published 2026 run)."""
    router: Literal["softmax", "sigmoid"] = "softmax"
    """Top-k over softmax scores (Mixtral, Qwen) or over sigmoid scores with a per-expert bias for
    auxiliary-loss-free balancing (DeepSeek-V3 `scoring_func: sigmoid`, `e_score_correction_bias`)."""
    router_groups: int | None = Field(default=None, gt=1)
    """Device-limited routing: experts in this many groups, a token's top-k taken from its best
    `router_group_topk` groups (DeepSeek-V3 `n_group` 8, `topk_group` 4; Megatron
    `--moe-router-num-groups`, `--moe-router-group-topk`). Changes no cost gplan prices."""
    router_group_topk: int | None = Field(default=None, gt=0)
    router_topk_scale: float | None = Field(default=None, gt=0)
    """Factor on the routed experts' weights (DeepSeek-V3 `routed_scaling_factor` 2.5; Megatron
    `--moe-router-topk-scaling-factor`)."""

    mtp_layers: int = Field(default=0, ge=0)
    """Multi-token prediction depths (DeepSeek-V3 §2.2: each predicts one more future token with a
    transformer layer of the model's last kind, a 2h → h projection and three norms, sharing the
    embedding and the output head; Hugging Face `num_nextn_predict_layers`, Megatron `--mtp-num-layers`).
    They run on the last pipeline stage, after the model's layers."""

    # ---- multi-head latent attention (DeepSeek-V2 §2.1) --------------------------------------------------
    q_lora_rank: int | None = Field(default=None, gt=0)
    """Rank of the query's down-projection; None: queries projected directly from the hidden state."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """Rank of the joint key/value compression; set: the model uses MLA, and `head_dim` is the
    non-rotary part of a query/key head (`qk_nope_head_dim`)."""
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    """The rotary part of each query/key head (shared over heads for keys); with kv_lora_rank."""
    v_head_dim: int | None = Field(default=None, gt=0)
    """Width of one value head under MLA; defaults to head_dim."""

    #: Fields added after plans of schema v1 were first written: left out of the inputs digest while at
    #: their default, so that those plans keep their digest.
    DIGEST_OPTIONAL: ClassVar[dict[str, object]] = {
        "head_dim": None, "rope_theta": 10000.0, "sliding_window": None, "qk_norm": False, "num_experts": None,
        "top_k": None, "moe_ffn_hidden_size": None, "num_shared_experts": 0, "shared_expert_ffn_hidden_size": None,
        "first_dense_layers": 0, "capacity_factor": None, "router": "softmax", "q_lora_rank": None,
        "kv_lora_rank": None, "qk_rope_head_dim": None, "v_head_dim": None, "qkv_bias": False, "router_groups": None,
        "router_group_topk": None, "router_topk_scale": None, "mtp_layers": 0, "full_attention_every": None,
        "attention_sinks": False, "glu_clamp": None}

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelSpec":
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_kv_heads "
                f"{self.kv_heads}"
            )
        if self.full_attention_every and not self.sliding_window:
            raise ValueError("full_attention_every needs sliding_window (the layers between the full ones are windowed)")
        if self.glu_clamp and self.ffn_kind != "swiglu":
            raise ValueError("glu_clamp is a gated unit's limit: it needs ffn_kind swiglu")
        self._check_experts()
        self._check_latent_attention()
        return self

    def _check_experts(self) -> None:
        moe_only = {"top_k": self.top_k, "moe_ffn_hidden_size": self.moe_ffn_hidden_size,
                    "num_shared_experts": self.num_shared_experts or None,
                    "shared_expert_ffn_hidden_size": self.shared_expert_ffn_hidden_size,
                    "first_dense_layers": self.first_dense_layers or None, "capacity_factor": self.capacity_factor}
        if self.num_experts is None:
            given = next((k for k, v in moe_only.items() if v is not None), None)
            if given:
                raise ValueError(f"{given} needs num_experts (the routed experts of a mixture-of-experts model)")
            return
        if self.top_k is None or self.top_k > self.num_experts:
            raise ValueError(f"top_k must be given and at most num_experts {self.num_experts} (the experts a "
                             "token is routed to)")
        if self.first_dense_layers >= self.num_layers or self.is_encoder_decoder:
            raise ValueError("a mixture-of-experts model is decoder-only with at least one MoE layer "
                             f"(first_dense_layers {self.first_dense_layers} of {self.num_layers})")

    def _check_latent_attention(self) -> None:
        mla = {"q_lora_rank": self.q_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim}
        if self.kv_lora_rank is None:
            given = next((k for k, v in mla.items() if v is not None), None)
            if given:
                raise ValueError(f"{given} needs kv_lora_rank (multi-head latent attention)")
        elif self.qk_rope_head_dim is None:
            raise ValueError("multi-head latent attention needs qk_rope_head_dim with kv_lora_rank")

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def kv_channels(self) -> int:
        """Width of one head: `head_dim` when given, else hidden_size / heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_hidden_size(self) -> int:
        """Width of the Q projection and of the output projection's input: kv_channels × heads."""
        return self.kv_channels * self.num_attention_heads

    @property
    def kv_hidden_size(self) -> int:
        """Width of the K (or V) projection: kv_channels × kv heads."""
        return self.kv_channels * self.kv_heads

    def digest_dump(self) -> dict:
        """The JSON the inputs digest hashes: every field, but those of DIGEST_OPTIONAL at their default."""
        return drop_defaults(self.model_dump(mode="json"), self.DIGEST_OPTIONAL)

    @property
    def total_layers(self) -> int:
        return self.num_layers + self.num_encoder_layers

    @property
    def is_encoder_decoder(self) -> bool:
        return self.num_encoder_layers > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def worst_case_routed_share(self, ep: int) -> float:
        """The most token-expert rows a rank's E/ep experts can receive, over the balanced k per token: each of the ep
        ranks' tokens can reach min(E/ep, k) of them, `ep·min(E/ep, k) / k` (what torchtitan sizes its host-free
        exchanges for: hybridep.py, minimal_async_ep/api.py)."""
        return ep * min(self.num_experts // ep, self.top_k) / self.top_k

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size

    @property
    def shared_expert_ffn_size(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.num_shared_experts * self.expert_ffn_size

    def layer_kinds(self) -> list[LayerKind]:
        """The stack in execution order: encoder layers first, then decoder layers; a mixture of experts
        has its leading dense layers (`decoder`), then its MoE layers (`moe_decoder`)."""
        if self.is_moe:
            moe = LayerKind("moe_decoder", self.num_layers - self.first_dense_layers, causal=True,
                            cross_attention=False, moe=True)
            dense = [LayerKind("decoder", self.first_dense_layers, causal=True, cross_attention=False)]
            return (dense if self.first_dense_layers else []) + [moe]
        if not self.is_encoder_decoder:
            return [LayerKind("decoder", self.num_layers, causal=True, cross_attention=False)]
        return [
            LayerKind("encoder", self.num_encoder_layers, causal=False, cross_attention=False),
            LayerKind("cross_decoder", self.num_layers, causal=True, cross_attention=True),
        ]

    # ---- parameter counts ----------------------------------------------------------------------
    def attention_params(self) -> int:
        """Q, K, V and output projections: h·(h_q + 2·h_kv) + h_q·h (+ biases: all four, or q, k, v only
        with `qkv_bias`), with h_q = a·d the
        heads' width (h unless head_dim says otherwise); MLA as `latent_attention_params`; a QK norm
        adds one scale of d for queries and one for keys."""
        if self.is_mla:
            return self.latent_attention_params()
        h, hq, hkv = self.hidden_size, self.q_hidden_size, self.kv_hidden_size
        weights = h * (hq + 2 * hkv) + hq * h
        qk_norm = 2 * self.kv_channels if self.qk_norm else 0
        biases = (hq + 2 * hkv) + h if self.bias else (hq + 2 * hkv if self.qkv_bias else 0)
        sinks = self.num_attention_heads if self.attention_sinks else 0
        return weights + biases + qk_norm + sinks

    def latent_attention_params(self) -> int:
        """MLA (DeepSeek-V2 §2.1, eqs. 9-14; DeepSeek-V3's `modeling_deepseek.py`), a heads of
        d_nope + d_rope query/key width and d_v value width:
        queries h·r_q + r_q (norm) + r_q·a·(d_nope + d_rope)   (h·a·(d_nope + d_rope) without r_q);
        keys/values h·(r_kv + d_rope) + r_kv (norm) + r_kv·a·(d_nope + d_v);  output a·d_v·h."""
        h, a = self.hidden_size, self.num_attention_heads
        nope, rope, v = self.kv_channels, self.qk_rope_head_dim, self.v_head_dim or self.kv_channels
        r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
        queries = h * r_q + r_q + r_q * a * (nope + rope) if r_q else h * a * (nope + rope)
        keys_values = h * (r_kv + rope) + r_kv + r_kv * a * (nope + v)
        return queries + keys_values + a * v * h

    def mlp_params(self) -> int:
        """gelu/relu: up and down (2·h·f); swiglu: gate, up and down (3·h·f); with their biases."""
        return self.ffn_params(self.ffn_size) + self.ffn_bias_params(self.ffn_size)

    def ffn_bias_params(self, width: int) -> int:
        """An MLP's biases where the model has them: the up (and gate) outputs' and the down output's."""
        return (self.ffn_matrices - 1) * width + self.hidden_size if self.bias else 0

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices of one MLP: up and down (gelu/relu), gate, up and down (swiglu)."""
        return 3 if self.ffn_kind == "swiglu" else 2

    def norm_params(self) -> int:
        """One norm: a scale, and a shift for LayerNorm when the model has biases (`bias` covers every
        additive bias, as `nn.LayerNorm(bias=...)` does)."""
        return self.hidden_size * (2 if self.norm == "layernorm" and self.bias else 1)

    def layer_params(self, kind: LayerKind) -> int:
        """One transformer layer: attention (+ cross-attention) + MLP (or router and experts) + its norms."""
        blocks = 2 if kind.cross_attention else 1
        mlp = self.moe_params() if kind.moe else self.mlp_params()
        return blocks * self.attention_params() + mlp + (blocks + 1) * self.norm_params()

    def ffn_params(self, width: int) -> int:
        """One MLP of inner width f: 2·h·f (gelu/relu) or 3·h·f (swiglu), without biases."""
        return self.ffn_matrices * self.hidden_size * width

    def router_params(self) -> int:
        """The router's h × E scores, and E biases: DeepSeek-V3's load-balancing ones with a sigmoid router,
        or a biased model's (gpt-oss)."""
        return self.hidden_size * self.num_experts + (self.num_experts if self.router == "sigmoid" or self.bias else 0)

    def expert_params(self) -> int:
        """One routed expert, with its biases where the model has them (gpt-oss's `gate_up_proj_bias`,
        `down_proj_bias`)."""
        return self.ffn_params(self.expert_ffn_size) + self.ffn_bias_params(self.expert_ffn_size)

    def shared_expert_params(self) -> int:
        return self.ffn_params(self.shared_expert_ffn_size) if self.shared_expert_ffn_size else 0

    def moe_params(self) -> int:
        """An MoE layer's MLP part: router, E routed experts and the shared experts."""
        return self.router_params() + self.num_experts * self.expert_params() + self.shared_expert_params()

    def active_params(self, input_embedding: bool = True) -> int:
        """Parameters a token passes through: every layer's attention and norms, the dense MLPs, and
        in MoE layers the router, top_k routed experts and the shared experts, with the head; the
        input embedding counted as Mistral and Qwen count it ("12.9B" of Mixtral 8x7B, "3.3B" of
        Qwen3-30B-A3B), or left out as DeepSeek counts (`input_embedding=False`: "37B" of DeepSeek-V3,
        "2.4B" of DeepSeek-V2-Lite) — a lookup, not a matrix product."""
        unused = 0
        if self.is_moe:
            moe_layers = self.num_layers - self.first_dense_layers + (self.mtp_layers if self.mtp_kind.moe else 0)
            unused = moe_layers * (self.num_experts - self.top_k) * self.expert_params()
        lookup = 0 if input_embedding else self.vocab_size * self.hidden_size
        return self.total_params() - unused - lookup

    def layer_params_per_rank(self, kind: LayerKind, tp: int) -> float:
        """One layer on one of tp ranks, as Megatron splits it: the weight matrices and the
        column-parallel biases (q, k, v, MLP up and gate) are divided by tp; the row-parallel biases
        (attention out, MLP down) and the norms are replicated on every rank."""
        blocks = 2 if kind.cross_attention else 1
        replicated = (blocks + 1) * ((self.hidden_size if self.bias else 0) + self.norm_params())
        return (self.layer_params(kind) - replicated) / tp + replicated

    def layer_param_tensors(self, kind: LayerKind) -> int:
        """Parameter tensors of one layer as Megatron-style modules hold them (what a per-tensor gather calls
        once each): the fused QKV, the output projection and the MLP's two linears (gate and up fused), a bias
        each where the model has them; two norms, a bias each under LayerNorm, and QK norms; an MoE layer's
        router and each expert's two linears in place of the dense MLP's."""
        norms = 2 * (2 if self.norm == "layernorm" else 1) + (2 if self.qk_norm else 0)
        biases = 4 if self.bias else (1 if self.qkv_bias else 0)
        mlp = 1 + 2 * self.num_experts if kind.moe and self.num_experts else 2
        return 2 + mlp + biases + norms

    def embedding_params_per_rank(self, tp: int) -> float:
        """The vocabulary-parallel token embedding is divided by tp; learned positions are replicated."""
        return self.vocab_size * self.hidden_size / tp + (self.embedding_params() - self.vocab_size * self.hidden_size)

    def head_params_per_rank(self, tp: int) -> float:
        """The output projection is divided by tp (vocabulary-parallel); the final norm is replicated."""
        return (self.head_params() - self.norm_params()) / tp + self.norm_params()

    def embedding_params(self) -> int:
        """Token embedding, plus learned positions where the model has them."""
        positions = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + positions

    def head_params(self) -> int:
        """Final norm plus the output projection unless it is tied to the embedding."""
        projection = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params() + projection

    def tp_divides(self, tp: int) -> bool:
        """Megatron splits attention by heads and the MLP by columns: tp must divide the attention
        heads, the kv heads and the MLP width."""
        return self.tp_divides_heads(tp) and not self.ffn_size % tp

    def tp_divides_heads(self, tp: int) -> bool:
        return not (self.num_attention_heads % tp or self.kv_heads % tp)

    @property
    def mtp_kind(self) -> LayerKind:
        """The layer kind of a multi-token-prediction depth: the model's last."""
        return self.layer_kinds()[-1]

    def mtp_extra_params(self) -> int:
        """One MTP depth beside its transformer layer: the 2h → h projection of [norm(h); norm(emb)] and
        its three norms (Megatron's MultiTokenPredictionLayer: enorm, hnorm, eh_proj, final_layernorm)."""
        return 2 * self.hidden_size * self.hidden_size + 3 * self.norm_params()

    def mtp_params(self) -> int:
        return self.mtp_layers * (self.layer_params(self.mtp_kind) + self.mtp_extra_params())

    def total_params(self) -> int:
        layers = sum(k.count * self.layer_params(k) for k in self.layer_kinds())
        encoder_final_norm = self.norm_params() if self.is_encoder_decoder else 0
        return layers + self.embedding_params() + self.head_params() + encoder_final_norm + self.mtp_params()
