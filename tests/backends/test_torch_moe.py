"""The torch worker's mixture-of-experts layer: routing, and expert parallelism over real gloo processes
— outputs and every gradient equal one process holding all experts (the end-to-end loss comparisons
are in test_torch_runs.py; Adam hides a gradient's scale there, so the scale is checked here)."""

from __future__ import annotations

import os

import pytest

from gplan.testing import requires_engine

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
    import torch

    moe = make_moe()
    loss = sum(moe(tokens_of(r)).pow(2).mean() for r in range(world)) / world
    loss.backward()
    return {"out": [moe(tokens_of(r)).detach() for r in range(world)],
            "grads": {n: p.grad.clone() for n, p in moe.named_parameters()}}


def _worker(rank: int, world: int, ep: int, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from gplan.backends.torch.apply_dp import average_expert_gradients
    from gplan.backends.torch.moe import ExpertGroup, apply_ep, is_expert_param

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        edp = world // ep
        # ep innermost: ranks [g·ep, (g+1)·ep) share experts; edp groups at stride ep
        ep_groups = [dist.new_group(list(range(g * ep, (g + 1) * ep))) for g in range(edp)]
        edp_groups = [dist.new_group(list(range(i, world, ep))) for i in range(ep)]
        moe = make_moe()
        apply_ep(moe, ExpertGroup(ep_groups[rank // ep], ep, rank % ep))
        for name in ("experts_w1", "experts_w2", "experts_w3"):  # this rank's block of the seeded weights
            block = EXPERTS // ep
            getattr(moe, name).data.copy_(getattr(make_moe(), name).data[rank % ep * block:(rank % ep + 1) * block])
        out = moe(tokens_of(rank))
        out.pow(2).mean().backward()
        average_expert_gradients([moe], edp_groups[rank % ep], edp, world)
        for name, p in moe.named_parameters():
            if not is_expert_param(name):  # dense parameters: averaged over dp, as the worker does
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        results[rank] = {"out": out.detach(), "grads": {n: p.grad.clone() for n, p in moe.named_parameters()}}
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, ep: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(world, ep, port, results), nprocs=world, join=True)
    return dict(results)


@pytest.mark.parametrize("world, ep", [(2, 2), (4, 2), (4, 4)])
def test_expert_parallel_outputs_and_gradients_equal_one_process(world, ep):
    import torch

    ref = reference(world)
    got = run_ranks(world, ep)
    block = EXPERTS // ep
    for rank in range(world):
        torch.testing.assert_close(got[rank]["out"], ref["out"][rank], atol=1e-5, rtol=1e-5)
        for name, grad in got[rank]["grads"].items():
            want = ref["grads"][name]
            if name.startswith("experts_"):
                want = want[rank % ep * block:(rank % ep + 1) * block]
            torch.testing.assert_close(grad, want, atol=1e-5, rtol=1e-5, msg=f"rank {rank} {name}")


def test_routing_keeps_k_experts_per_token_and_sigmoid_weights_sum_to_one():
    import torch

    moe = make_moe()
    moe.router_kind = "sigmoid"
    weights, ids = moe.route(tokens_of(0).reshape(-1, DIM))
    assert ids.shape == (TOKENS, TOP_K) and ids.unique(dim=1).shape == ids.shape
    torch.testing.assert_close(weights.sum(-1), torch.ones(TOKENS))
