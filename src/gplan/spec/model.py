"""ModelSpec: the shape of a transformer, as much as the cost model and the workers need.

Decoder-only stacks (GPT, Llama, Mistral, Qwen2, GPT-NeoX) and encoder–decoder stacks (the original
Transformer) are covered. A stack is a sequence of *layer kinds*, each repeated `count` times; the
planner places counts of identical layers on pipeline stages (docs/design.md, "Search").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gplan.errors import InputError
from gplan.io import drop_defaults


@dataclass(frozen=True)
class LayerKind:
    """One kind of repeated transformer layer."""

    name: str
    """`decoder` (causal self-attention), `encoder` (bidirectional) or `cross_decoder`
    (causal self-attention plus cross-attention over the encoder output)."""
    count: int
    causal: bool
    cross_attention: bool


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
    head_dim: int | None = Field(default=None, gt=0)
    """Width of one attention head (Hugging Face `head_dim`, Megatron `--kv-channels`); defaults to
    hidden_size / num_attention_heads. Mistral-Nemo's 32 heads of 128 project 5120 to 4096."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base (Hugging Face `rope_theta`, Megatron `--rotary-base`): 10000 in the RoPE paper and
    Llama 2, 500000 in Llama 3. It changes no cost, but every engine must train with it."""

    sliding_window: int | None = Field(default=None, gt=0)
    """Sliding-window attention: each query attends to the last `sliding_window` tokens (Mistral 7B
    v0.1's 4096; Hugging Face `sliding_window`); None: full attention."""

    #: Fields added after plans of schema v1 were first written: left out of the inputs digest while at
    #: their default, so that those plans keep their digest.
    DIGEST_OPTIONAL: ClassVar[dict[str, object]] = {"head_dim": None, "rope_theta": 10000.0, "sliding_window": None}

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
        return self

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

    def layer_kinds(self) -> list[LayerKind]:
        """The stack in execution order: encoder layers first, then decoder layers."""
        if not self.is_encoder_decoder:
            return [LayerKind("decoder", self.num_layers, causal=True, cross_attention=False)]
        return [
            LayerKind("encoder", self.num_encoder_layers, causal=False, cross_attention=False),
            LayerKind("cross_decoder", self.num_layers, causal=True, cross_attention=True),
        ]

    # ---- parameter counts ----------------------------------------------------------------------
    def attention_params(self) -> int:
        """Q, K, V and output projections: h·(h_q + 2·h_kv) + h_q·h (+ biases), with h_q = a·d the
        heads' width (h unless head_dim says otherwise)."""
        h, hq, hkv = self.hidden_size, self.q_hidden_size, self.kv_hidden_size
        weights = h * (hq + 2 * hkv) + hq * h
        return weights + ((hq + 2 * hkv) + h if self.bias else 0)

    def mlp_params(self) -> int:
        """gelu/relu: up and down (2·h·f); swiglu: gate, up and down (3·h·f)."""
        h, f = self.hidden_size, self.ffn_size
        matrices = 3 if self.ffn_kind == "swiglu" else 2
        return matrices * h * f + ((matrices - 1) * f + h if self.bias else 0)

    def norm_params(self) -> int:
        """One norm: a scale, and a shift for LayerNorm when the model has biases (`bias` covers every
        additive bias, as `nn.LayerNorm(bias=...)` does)."""
        return self.hidden_size * (2 if self.norm == "layernorm" and self.bias else 1)

    def layer_params(self, kind: LayerKind) -> int:
        """One transformer layer: attention (+ cross-attention) + MLP + its norms."""
        blocks = 2 if kind.cross_attention else 1
        return blocks * self.attention_params() + self.mlp_params() + (blocks + 1) * self.norm_params()

    def layer_params_per_rank(self, kind: LayerKind, tp: int) -> float:
        """One layer on one of tp ranks, as Megatron splits it: the weight matrices and the
        column-parallel biases (q, k, v, MLP up and gate) are divided by tp; the row-parallel biases
        (attention out, MLP down) and the norms are replicated on every rank."""
        blocks = 2 if kind.cross_attention else 1
        replicated = (blocks + 1) * ((self.hidden_size if self.bias else 0) + self.norm_params())
        return (self.layer_params(kind) - replicated) / tp + replicated

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
        return not (self.num_attention_heads % tp or self.kv_heads % tp or self.ffn_size % tp)

    def total_params(self) -> int:
        layers = sum(k.count * self.layer_params(k) for k in self.layer_kinds())
        encoder_final_norm = self.norm_params() if self.is_encoder_decoder else 0
        return layers + self.embedding_params() + self.head_params() + encoder_final_norm


def check_tp_divides(model: ModelSpec, tp: int) -> None:
    """`ModelSpec.tp_divides`, refused with the count it breaks."""
    if model.tp_divides(tp):
        return
    if model.num_attention_heads % tp or model.kv_heads % tp:
        raise InputError(
            f"tp={tp} does not divide the model's heads ({model.num_attention_heads} attention, "
            f"{model.kv_heads} kv)",
            hint="choose tp among the common divisors of the attention and kv head counts",
        )
    raise InputError(
        f"tp={tp} does not divide ffn_hidden_size {model.ffn_size}",
        hint="choose a tp that divides the MLP width",
    )
