"""Training tokens: synthetic (seeded per step; each row an arithmetic progression modulo the
vocabulary, from a random start with a random stride of 1–8, so the loss falls quickly and a wrong
gradient shows) or a flat token file (nanoGPT's `.bin`: uint16 when
the vocabulary fits, else uint32), memory-mapped. Batches depend only on the step, so a resumed run
sees the same data as an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class Tokens:
    def __init__(self, vocab_size: int, seq_length: int, gbs: int, seed: int, path: Path | None = None):
        self.vocab_size, self.seq_length, self.gbs, self.seed = vocab_size, seq_length, gbs, seed
        self.array = None
        if path is not None:
            dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
            self.array = np.memmap(path, dtype=dtype, mode="r")
            if len(self.array) < seq_length + 1:
                raise ValueError(f"{path}: {len(self.array)} tokens, fewer than one sequence of {seq_length + 1}")

    def global_batch(self, step: int) -> torch.Tensor:
        """(gbs, seq_length + 1) int64 tokens of `step`."""
        width = self.seq_length + 1
        if self.array is None:
            generator = torch.Generator().manual_seed(self.seed * 7919 + step)
            start = torch.randint(self.vocab_size, (self.gbs, 1), generator=generator)
            stride = torch.randint(1, 9, (self.gbs, 1), generator=generator)
            return (start + stride * torch.arange(width)) % self.vocab_size
        span = len(self.array) - width + 1
        starts = [((step * self.gbs + i) * width) % span for i in range(self.gbs)]
        rows = np.stack([np.asarray(self.array[s:s + width], dtype=np.int64) for s in starts])
        return torch.from_numpy(rows)

    def dp_slice(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's rows of the global batch: inputs and next-token targets."""
        rows = self.global_batch(step).chunk(dp)[dp_rank]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
