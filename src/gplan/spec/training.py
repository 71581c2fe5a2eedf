"""TrainingSpec: the options of one training run that change costs but not the model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["bf16", "fp16", "fp32"]

#: Bytes of one activation or weight element in each training precision.
ELEMENT_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


class TrainingSpec(BaseModel):
    """Batch, sequence, precision and memory policy of a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gbs: int = Field(gt=0)
    """Global batch size in sequences per optimizer step."""
    seq_length: int = Field(gt=0)
    """Tokens per sequence."""
    precision: Precision = "bf16"
    """Mixed precision with fp32 master weights for bf16/fp16; plain fp32 otherwise."""
    optimizer: Literal["adam"] = "adam"
    memory_headroom: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Fraction of each device's memory kept free (fragmentation, spikes)."""
    flash_attention: bool = True
    """Fused attention: no s×s score matrix is stored, and causal masking halves its FLOPs."""

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.precision]

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq_length
