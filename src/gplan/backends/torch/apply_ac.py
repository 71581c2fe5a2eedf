"""Activation recomputation per layer, as the plan's stage split says: `full` keeps only a block's
input for the backward; `selective` only the inputs of the attention core (Korthikanti et al. 2022), or,
where the plan's selective layers recompute the module `op`, torchtitan's per-operator policy over the
block (model.per_op_contexts)."""

from __future__ import annotations

from gplan.backends.torch.model import Transformer


def apply_recompute(model: Transformer, recompute_by_layer: dict[int, str], per_op: bool = False) -> None:
    for name, block in model.layers.items():
        option = recompute_by_layer[int(name)]
        block.recompute_full = option == "full"
        block.recompute_per_op = option == "selective" and per_op
        block.attention.recompute_core = option == "selective" and not per_op
