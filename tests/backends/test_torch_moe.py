"""The torch worker's mixture-of-experts layer: routing, and expert parallelism over real gloo processes
— outputs and every gradient equal one process holding all experts (the end-to-end loss comparisons
are in test_torch_runs.py; Adam hides a gradient's scale there, so the scale is checked here)."""

from __future__ import annotations

import os

import pytest

from forked_ranks import forkserver, free_port
from helpers import requires_engine

pytestmark = requires_engine("torch", "torch")

DIM, EXPERTS, TOP_K, FFN, TOKENS = 16, 4, 2, 24, 12


def make_moe(seed: int = 0):
    import torch
    from torch import nn

    from gplan.backends.torch.model import FeedForward, ModelArgs
    from gplan.backends.torch.moe import MoE

    args = ModelArgs(dim=DIM, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=FFN, ffn_kind="swiglu", vocab_size=8,
                     max_seq_len=8, norm="rmsnorm", position="rope", tie_embeddings=False, bias=False)
    torch.manual_seed(seed)
    moe = MoE(DIM, EXPERTS, TOP_K, FFN, "swiglu", "softmax", FeedForward(args, 8))
    for p in moe.parameters():
        nn.init.normal_(p, std=0.3)
    return moe


def tokens_of(rank: int):
    import torch

    return torch.randn(1, TOKENS, DIM, generator=torch.Generator().manual_seed(100 + rank))


def reference(world: int) -> dict:
    """One process, every expert, the mean of the ranks' losses (each the mean over its own tokens)."""
    moe = make_moe()
    loss = sum(moe(tokens_of(r)).pow(2).mean() for r in range(world)) / world
    loss.backward()
    return {"out": [moe(tokens_of(r)).detach() for r in range(world)],
            "grads": {n: p.grad.clone() for n, p in moe.named_parameters()}}


def _worker(rank: int, world: int, ep: int, etp: int, port: int, results) -> None:
    import torch.distributed as dist

    from gplan.backends.torch.apply_dp import average_expert_gradients
    from gplan.backends.torch.moe import ExpertGroup, apply_ep, expert_slice, is_expert_param

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        edp = world // (ep * etp)
        # the expert grid edp × ep × etp, etp innermost: rank = (d·ep + e)·etp + t
        where = {r: (r // (ep * etp), r // etp % ep, r % etp) for r in range(world)}
        groups = {}
        for axis in range(3):  # every group of ranks differing only along `axis` (new_group on all ranks alike)
            for r in range(world):
                key = (axis, tuple(v for i, v in enumerate(where[r]) if i != axis))
                if key not in groups:
                    groups[key] = dist.new_group([q for q in range(world) if all(
                        where[q][i] == where[r][i] for i in range(3) if i != axis)])
        mine = where[rank]
        group_of = lambda axis: groups[(axis, tuple(v for i, v in enumerate(mine) if i != axis))]
        moe = make_moe()
        full = make_moe()
        apply_ep(moe, ExpertGroup(group_of(1), ep, mine[1], group_of(2), etp, mine[2]))
        for name, p in moe.named_parameters():  # this rank's block of the seeded weights
            block = expert_slice(moe, name)
            if block is not None:
                p.data.copy_(getattr(full, name).data[block[1]])
        out = moe(tokens_of(rank))
        out.pow(2).mean().backward()
        average_expert_gradients([moe], group_of(0), edp, world)
        for name, p in moe.named_parameters():
            if not is_expert_param(name):  # dense parameters: averaged over dp, as the worker does
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        results[rank] = {"out": out.detach(), "grads": {n: p.grad.clone() for n, p in moe.named_parameters()},
                         "blocks": {n: expert_slice(moe, n)[1] for n, _ in moe.named_parameters() if is_expert_param(n)}}
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, ep: int, etp: int = 1) -> dict:
    import torch.multiprocessing as mp

    port = free_port()
    forkserver()  # the ranks forked from a server that imported torch once (tests/forked_ranks.py)
    manager = mp.Manager()
    results = manager.dict()
    mp.start_processes(_worker, args=(world, ep, etp, port, results), nprocs=world, join=True, start_method="forkserver")
    return dict(results)


@pytest.mark.parametrize("world, ep, etp", [(2, 2, 1), (4, 2, 1), (4, 4, 1), (2, 1, 2), (4, 2, 2), (4, 1, 4)])
def test_expert_parallel_outputs_and_gradients_equal_one_process(world, ep, etp):
    """ep and etp (each expert's width split over the etp ranks, which gather their tokens): every rank's
    output and every gradient — dense, and its block of the experts — equal one process's."""
    import torch

    ref = reference(world)
    got = run_ranks(world, ep, etp)
    for rank in range(world):
        torch.testing.assert_close(got[rank]["out"], ref["out"][rank], atol=1e-5, rtol=1e-5)
        for name, grad in got[rank]["grads"].items():
            want = ref["grads"][name]
            if name.startswith("experts_"):
                want = want[got[rank]["blocks"][name]]
            torch.testing.assert_close(grad, want, atol=1e-5, rtol=1e-5, msg=f"rank {rank} {name}")


def test_routing_keeps_k_experts_per_token_and_sigmoid_weights_sum_to_one():
    import torch

    moe = make_moe()
    moe.router_kind = "sigmoid"
    weights, ids = moe.route(tokens_of(0).reshape(-1, DIM))
    assert ids.shape == (TOKENS, TOP_K) and ids.unique(dim=1).shape == ids.shape
    torch.testing.assert_close(weights.sum(-1), torch.ones(TOKENS))
