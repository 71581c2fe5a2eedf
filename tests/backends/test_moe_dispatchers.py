"""Megatron-core's three token dispatchers (TrainingSpec.moe_dispatcher) from the command line to the cost model,
the export and back: what each holds (the all-to-all's send buffer, the all-gather's gathered tokens, DeepEP's
buffers beside the communicators), what the all-gather sends whatever the routing, Megatron-LM's flags (checked by
megatron_rules.py and megatron-core's own TransformerConfig), `--from` reading them as Megatron defaults them, and
bad input exiting 3 with a hint."""

from __future__ import annotations

import json

import pytest

import megatron_rules
from gplan.cost_models import experts
from gplan.cost_models.compute import Shard
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec
from helpers import requires_engine
from test_moe_engine_options import MOE, _exported

QWEN = load_model("qwen3-30b-a3b")


def _step(dispatcher: str, config: ParallelConfig, imbalance: float = 1.0) -> StepModel:
    training = TrainingSpec(gbs=256, seq_length=4096, precision="bf16", engine="megatron",
                            moe_dispatcher=dispatcher, expert_imbalance=imbalance)
    return StepModel(QWEN, training, load_cluster("dgx-h100", config.world_size), config)


def test_deepeps_buffers_follow_its_own_size_hints():
    """DeepEP's csrc/config.hpp: 10 channels (Megatron's 20 SMs) × min(ep, 8) NVLink peers × the dispatch config's
    receive tokens × (h·2 bytes + 2056 bytes of meta: source 8, 128 int64 indices, 128 fp32 weights and scales);
    across nodes an RDMA buffer of 2 × 10 × ep/8 × 128 tokens × (the same + 16)."""
    h = QWEN.hidden_size  # 2048
    token = 2 * h + 8 + 128 * 8 + 128 * 4 + 128 * 4
    assert experts.flex_buffer_bytes(QWEN, ParallelConfig(dp=8, ep=8), 2) == 10 * 8 * 256 * token
    assert experts.flex_buffer_bytes(QWEN, ParallelConfig(dp=32, ep=32), 2) == \
        10 * 8 * 288 * token + 2 * 10 * 4 * 128 * (token + 16)
    assert experts.flex_buffer_bytes(QWEN, ParallelConfig(dp=8, ep=1), 2) == 0  # no dispatch, no buffer


def test_each_dispatcher_holds_its_own_buffer():
    shard = Shard(batch=1, seq=4096, kv_seq=4096, tp=1, sp=False)
    config = ParallelConfig(dp=16, ep=8)
    alltoall = experts.dispatch_buffer_bytes(QWEN, shard, config, 2, "alltoall")
    assert alltoall == QWEN.top_k * 4096 * QWEN.hidden_size * 2  # the k permuted copies being sent
    assert experts.dispatch_buffer_bytes(QWEN, shard, config, 2, "allgather") == 4096 * 8 * QWEN.hidden_size * 2
    assert experts.dispatch_buffer_bytes(QWEN, shard, config, 2, "flex") == 0


def test_flex_trades_the_send_buffer_for_deepeps_fixed_one():
    config = ParallelConfig(dp=16, ep=16, mbs=1, zero=1)
    plain_step, flex_step = _step("alltoall", config), _step("flex", config)
    plain, flex = plain_step.predict(), flex_step.predict()
    p, f = plain.stages[0].memory, flex.stages[0].memory
    assert f.communicator_bytes - p.communicator_bytes == pytest.approx(experts.flex_buffer_bytes(QWEN, config, 2))
    send = experts.dispatch_bytes(QWEN, plain_step.shard, 2)  # no permuted copy in flight
    assert plain_step.layer_transient_bytes("moe_decoder", "none") - flex_step.layer_transient_bytes("moe_decoder", "none") == \
        pytest.approx(send)
    # ep 16 spans two 8-GPU nodes: DeepEP sends a token once per destination node, the all-to-all each copy
    assert flex.step_time_s < plain.step_time_s
    inside = ParallelConfig(dp=8, ep=8, mbs=1, zero=1)  # one node: the same bytes, the same time
    assert _step("flex", inside).predict().step_time_s == pytest.approx(_step("alltoall", inside).predict().step_time_s)


def test_deepep_sends_a_token_once_per_destination_domain():
    """The share of the all-to-all's cross-domain bytes DeepEP sends: D·(1 − (1 − 1/D)^k) / k for k experts
    over D domains — none saved inside one domain, more the fewer the domains."""
    assert experts.deepep_outside_share(QWEN, 8, 8) == 1.0
    k = QWEN.top_k
    for domains in (2, 4, 8):
        share = experts.deepep_outside_share(QWEN, 8 * domains, 8)
        assert share == pytest.approx(domains * (1 - (1 - 1 / domains) ** k) / k)
    assert experts.deepep_outside_share(QWEN, 16, 8) < experts.deepep_outside_share(QWEN, 64, 8) < 1


def test_the_allgather_dispatcher_sends_every_token_whatever_the_routing():
    config = ParallelConfig(dp=16, ep=16, mbs=1, zero=1)
    for dispatcher in ("alltoall", "allgather"):
        balanced = _step(dispatcher, config).layer_ep_comm_s("moe_decoder", "none", 0)
        skewed = _step(dispatcher, config, imbalance=1.5).layer_ep_comm_s("moe_decoder", "none", 0)
        if dispatcher == "allgather":
            assert skewed == pytest.approx(balanced)
        else:
            assert skewed > balanced
    wider = ParallelConfig(dp=32, ep=32, mbs=1, zero=1)  # twice the group: twice the tokens gathered
    assert _step("allgather", wider).layer_ep_comm_s("moe_decoder", "none", 0) > \
        _step("allgather", config).layer_ep_comm_s("moe_decoder", "none", 0)


def test_a_flex_search_is_exported_with_deepep_and_read_back_at_its_price(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    r = gplan("search", *MOE, "--target", "megatron", "--moe-dispatcher", "flex", "--out", str(plan_path))
    assert r.code == 0, r.stderr
    plan, args = _exported(gplan, plan_path, tmp_path / "megatron")
    assert plan["training"]["moe_dispatcher"] == "flex"
    assert args.moe_token_dispatcher_type == "flex" and args.moe_enable_deepep
    back = gplan("estimate", "qwen3-30b-a3b", "--from", str(tmp_path / "megatron" / "megatron_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)
    assert back["memory_bytes_per_device_max"] == pytest.approx(plan["prediction"]["memory_bytes_per_device_max"],
                                                                rel=1e-6)


def test_deepep_needs_the_flex_dispatcher_in_megatrons_rules():
    with pytest.raises(megatron_rules.Violation, match="only supported with flex token dispatcher"):
        megatron_rules._validate_dispatcher(megatron_rules.parser().parse_args(
            ["--moe-token-dispatcher-type", "alltoall", "--moe-enable-deepep"]))


@requires_engine("megatron.core", "dev")
def test_megatron_core_accepts_the_exported_dispatcher_and_refuses_deepep_without_flex():
    from megatron.core.transformer.transformer_config import TransformerConfig

    common = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
                  expert_model_parallel_size=1)
    TransformerConfig(**common, moe_token_dispatcher_type="flex", moe_enable_deepep=True)
    with pytest.raises(ValueError, match="only supported with flex token dispatcher"):
        TransformerConfig(**common, moe_token_dispatcher_type="alltoall", moe_enable_deepep=True)


def test_a_megatron_script_without_the_flag_runs_megatrons_default_allgather(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *MOE, "--target", "megatron", "--tp", "1", "--pp", "1", "--out", str(plan_path)).code == 0
    _exported(gplan, plan_path, tmp_path / "megatron")
    script = tmp_path / "megatron" / "megatron_pretrain_gpt.sh"
    text = script.read_text()
    assert "--moe-token-dispatcher-type alltoall" in text
    script.write_text(text.replace("--moe-token-dispatcher-type alltoall", ""))
    read = gplan("estimate", "qwen3-30b-a3b", "--from", str(script), "--cluster", "dgx-h100", "--json").json()
    assert read["engine_options"]["moe_dispatcher"] == "allgather"
    alltoall_plan = json.loads(plan_path.read_text())
    assert read["step_time_s"] != pytest.approx(alltoall_plan["prediction"]["step_time_s"], rel=1e-3)
    said = gplan("estimate", "qwen3-30b-a3b", "--from", str(script), "--cluster", "dgx-h100")
    assert "engine options read: --moe-dispatcher allgather" in " ".join(said.stdout.split() + said.stderr.split())


@pytest.mark.parametrize("argv, says, hint", [
    ([*MOE, "--target", "mindformers", "--moe-dispatcher", "flex"], "capability moe_dispatcher",
     "--target megatron or torchtitan"),
    ([*MOE, "--target", "torchtitan", "--moe-dispatcher", "allgather"], "capability moe_dispatcher", "--target megatron"),
    (["llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--target", "megatron", "--moe-dispatcher", "flex"],
     "has no experts", "leave --moe-dispatcher out"),
    ([*MOE, "--target", "megatron", "--moe-dispatcher", "allgather", "--moe-a2a-overlap"], "not the all-gather's",
     "--moe-dispatcher alltoall or flex"),
    ([*MOE, "--target", "megatron", "--moe-dispatcher", "deepep"], "--moe-dispatcher", "gplan --help"),
])
def test_bad_dispatchers_exit_3_with_a_hint(gplan, argv, says, hint):
    r = gplan("estimate", *argv)
    assert r.code == 3, r.stderr
    assert says in r.stderr and hint in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("named, read", [(None, "allgather"), ("alltoall", "alltoall"), ("flex", "flex"),
                                         ("allgather", "allgather")])
def test_a_launch_or_logs_dispatcher_reads_as_megatron_defaults_it(named, read):
    """A log prints `moe_token_dispatcher_type` always; a script may leave it to Megatron's default."""
    from gplan.engines.megatron.launch import dispatcher_of

    assert dispatcher_of(named, QWEN) == read
    assert dispatcher_of(named, load_model("llama3-8b")) == "alltoall"  # no experts: moot, gplan's default


def test_an_unknown_dispatcher_in_a_launch_is_refused_with_a_hint():
    from gplan.errors import InputError
    from gplan.engines.megatron.launch import dispatcher_of

    with pytest.raises(InputError, match="alltoall, allgather and flex"):
        dispatcher_of("deepep", QWEN)
