"""Activation recomputation per layer, as the plan's stage split says: `full` keeps only a block's
input for the backward, `selective` only the inputs of the attention core (Korthikanti et al. 2022)."""

from __future__ import annotations

from gplan.backends.torch.model import Transformer


def apply_recompute(model: Transformer, recompute_by_layer: dict[int, str]) -> None:
    for name, block in model.layers.items():
        option = recompute_by_layer[int(name)]
        block.recompute_full = option == "full"
        block.attention.recompute_core = option == "selective"
