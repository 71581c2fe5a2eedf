"""Mixture-of-experts layers: the router, the routed experts' grouped GEMMs, the shared experts, the
all-to-all token dispatch and combine, and what the experts keep in memory — Megatron-core's MoELayer
with the all-to-all dispatcher, under MoE parallel folding (Liu et al. 2025, arXiv 2504.14960): the
attention side of a stage runs tp × cp × dp, its expert side etp × ep × edp over the same ranks.

Token flow on one device, per micro-batch and MoE layer (MoE with tp runs sequence parallelism, so each
tp rank starts from its own slice of the tokens):
1. `source_tokens` = b·s/(cp·tp) hidden states enter the router (h × E scores, top-k);
2. all-to-all over ep: each token's k copies go to the ranks holding its experts; with etp > 1 the etp
   ranks of one expert shard all-gather what they received;
3. each device runs its E/ep local experts (1/etp of each one's width) over `routed_pairs` tokens —
   one grouped GEMM per matrix;
4. the reverse: reduce-scatter over etp, all-to-all back, the k outputs weighted and summed.
With balanced routing a device computes `k·b·s/(cp·tp)` token-expert pairs whatever ep and etp are:
ep and etp change the GEMMs' shapes, the all-to-all and the memory, not the FLOPs per device.
`imbalance` (≥ 1; `routed_load`, capped or padded to an expert capacity) scales the busiest device's routed
work and traffic: 1.0 is the balanced limit the
published Megatron-Bridge runs force (`moe_router_force_load_balancing`). Each pass of a layer also
exposes host time (`host_time_s`: the dispatcher's sync, per-expert launches) unless CUDA graphs capture
the iteration.
"""

from __future__ import annotations

from gplan.cost_models.compute import GEMM_BACKWARD_FLOP_RATIO, Gemm, Shard, gemm_time_s, memory_time_s
from gplan.cost_models.memory import activation_inputs
from gplan.engines.profile import MemoryAccounting
from gplan.profiles.schema import DeviceSpec
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, captured_graphs
from gplan.spec.training import TrainingSpec


GROUPED_GEMM_EFFICIENCY = 1.0
"""Routed experts' grouped GEMMs against a dense GEMM of one expert's shape. This and the constants below
are fitted together on Megatron-Bridge's 84 MoE rows (`bench/accuracy.py --fit`: the mean absolute log
error, each row with the overlap and graphs its settings state; README, "Mixture of experts")."""
ALLTOALL_EFFICIENCY = 1.834
"""Achieved over modelled all-to-all speed (fitted, as above): NCCL's all-to-all and DeepEP's kernels against
the links' modelled bandwidth. DeepEP's per-domain de-duplication is modelled apart (`deepep_outside_share`);
before it was, this lumped it in at 1.915."""
OVERLAPPED_ALLTOALL_EXPOSED = 0.80
"""The share of the all-to-all left exposed under Megatron-core's `--overlap-moe-expert-parallel-comm`,
which runs one micro-batch's dispatch and combine beside another's attention and MLP (its combined 1F1B
schedule): fitted as above — a fifth of it hidden on the rows that run it (0.95 before the de-duplication
was modelled apart, which had lumped the cross-node rows' savings into the all-to-all's speed)."""
HOST_SYNC_S: dict[str, float] = {"none": 1.0e-3, "moe_router": 0.8e-3, "full_iteration": 0.0}
"""Exposed host time per MoE layer and pass (forward, backward, a replayed forward), by CUDA-graph
capture (TrainingSpec.cuda_graphs): a dropless dispatcher reads the tokens per expert back to the host
before it can size the grouped GEMMs (a device-to-host sync that drains the launch queue), then launches
the router, permutation and dispatch kernels one by one; a captured iteration leaves none of it. Fitted as
above: capturing the router and the permutation (`moe_router`) saves a fifth of it."""
EXPERT_LAUNCH_S = 0.12e-3
"""Exposed host time per local expert, MoE layer and pass without a captured iteration: Transformer
Engine's grouped linear launches each expert's GEMMs (and their FP8 casts) as separate kernels, so a
device holding many small experts waits on launches. Fitted as above."""


def source_tokens(shard: Shard) -> float:
    """Tokens one device routes: its micro-batch slice after cp, and after tp with sequence parallelism."""
    return shard.tokens / (shard.tp if shard.sp else 1)


def routed_pairs(model: ModelSpec, shard: Shard, etp: int) -> float:
    """Token-expert pairs one device's local experts compute, balanced: the k copies of the tokens of
    the etp ranks sharing its expert shards, spread evenly over the ep ranks (step 2 above)."""
    return model.top_k * source_tokens(shard) * etp


def local_experts(model: ModelSpec, config: ParallelConfig) -> int:
    return model.num_experts // config.ep


def expert_gemms(model: ModelSpec, shard: Shard, config: ParallelConfig) -> list[Gemm]:
    """The grouped GEMMs of one device's local experts, each given as the whole group's work (all its
    E/ep experts' tokens as rows): up (gate and up for swiglu) and down, 1/etp of the width each."""
    h, f, etp = model.hidden_size, model.expert_ffn_size, config.etp
    rows = int(round(routed_pairs(model, shard, etp)))
    up = 2 * f if model.ffn_kind == "swiglu" else f
    return [Gemm(rows, up // etp, h), Gemm(rows, h, f // etp)]


def routed_time_s(model: ModelSpec, training: TrainingSpec, shard: Shard, config: ParallelConfig,
                  device: DeviceSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the routed experts on the busiest device: the grouped GEMMs at the
    training precision, each at the efficiency of one expert's GEMM (the group's tiles are per expert:
    E/ep small GEMMs in one launch: `grouped_gemm_time_s`), at the engine's kernel's measured speed in each pass
    (`kernel_ratios`), times the busiest device's load (`routed_load`); the permutation and activation at HBM
    speed. Backward: 2× the GEMMs (input and weight gradients) and the element-wise traffic."""
    groups = local_experts(model, config)
    gemm_s = sum(grouped_gemm_time_s(device, training.precision, g, groups) for g in expert_gemms(model, shard, config))
    moved_s = memory_time_s(device, routed_elementwise_elements(model, shard, config) * training.element_bytes)
    forward_ratio, backward_ratio = kernel_ratios(training, device)
    load = routed_load(model, training, config.ep)
    return ((gemm_s / forward_ratio + moved_s) * load,
            GEMM_BACKWARD_FLOP_RATIO * (gemm_s / backward_ratio + moved_s) * load)


def grouped_gemm_time_s(device: DeviceSpec, precision: str, whole: Gemm, groups: int) -> float:
    """One grouped GEMM of `groups` equal groups, `whole` its work with every group's rows: at the efficiency of one
    group's GEMM (its tiles are per group), over the grouped kernels' fitted efficiency."""
    one = Gemm(max(1, int(round(whole.m / groups))), whole.n, whole.k)
    return gemm_time_s(device, precision, one) * whole.flops / one.flops / GROUPED_GEMM_EFFICIENCY


def kernel_ratios(training: TrainingSpec, device: DeviceSpec) -> tuple[float, float]:
    """(forward, backward) speed of the routed GEMMs over the grouped GEMMs the constants above were fitted on: where
    the engine runs them on `torch._grouped_mm` in BF16 or FP16, the device's measured forward ratio, and the
    backward's that makes the forward's one product and the backward's two take what the kernel's timings of all
    three take (`torch_grouped_mm_ratio`: 3/r = 1/r_forward + 2/r_backward); its low-precision recipes run torchao's
    scaled grouped GEMMs, not timed apart: 1."""
    if not (training.profile.expert_kernel == "torch_grouped_mm" and training.precision in ("bf16", "fp16")):
        return 1.0, 1.0
    forward, both = device.torch_grouped_mm_forward_ratio, device.torch_grouped_mm_ratio
    return forward, 2.0 / (3.0 / both - 1.0 / forward)


def routed_load(model: ModelSpec, training: TrainingSpec, ep: int) -> float:
    """The busiest device's routed tokens over the balanced share, as its GEMMs, traffic and buffers see them: the
    routing's imbalance (`TrainingSpec.expert_imbalance`), capped where the model drops tokens over a capacity
    (`capacity_factor` × the balanced share: Megatron's --moe-expert-capacity-factor), and exactly that capacity
    where every expert's input is padded to it (`moe_pad_to_capacity`: --moe-pad-expert-input-to-capacity).
    Without expert parallelism (ep 1) every device sends its own tokens to its own copies of every expert: its
    k·tokens pairs are the balanced share whatever the routing, so only a padded capacity changes them."""
    capacity = model.capacity_factor
    if capacity is not None and training.moe_pad_to_capacity:
        return capacity
    if ep == 1:
        return 1.0
    if capacity is None and training.moe_rows_capacity is not None:  # a busier device's tokens past it dropped
        capacity = allocated_load(model, training, ep)
    return training.expert_imbalance if capacity is None else min(training.expert_imbalance, capacity)


def allocated_load(model: ModelSpec, training: TrainingSpec, ep: int, buffered_microbatches: int = 1) -> float:
    """The rows the busiest device's routed tensors hold over the balanced share: its routed load, or where the
    exchange sizes the experts' input without the host (`TrainingSpec.moe_rows_capacity` c) that allocation, whatever
    the router sends: `ep·min(E/ep, k)·c / k` of the balanced `k·tokens` (DeepSeek-V3 16B at ep 8, c = 1: 8×) —
    HybridEP's non-blocking output, `tokens·ep·min(E/ep, k)·c` rows (hybridep.py `_num_permuted_tokens_for_non_
    blocking`); MinimalAsyncEP hands the experts its whole receive buffer (api.py `_copy_rows_to_peers_and_wait_cuda`
    returns it), `ep·T_max·min(k, E/ep)` rows, T_max a rank's local batch: the micro-batches one pipelined step holds
    (`buffered_microbatches`) times a micro-batch's. The grouped GEMMs still compute the routed rows only (their
    offsets end there)."""
    share = training.moe_rows_capacity
    if share is None:
        return routed_load(model, training, ep)
    buffered = buffered_microbatches if training.moe_dispatcher == "symmetric_memory" else 1
    return model.worst_case_routed_share(ep) * share * buffered


def routed_input_bytes(model: ModelSpec, shard: Shard, config: ParallelConfig, gemm_input: float) -> float:
    """The experts' permuted input, `g·h` per routed pair: what MinimalAsyncEP's receive buffer holds in place of a
    tensor of its own (`symmetric_buffer_bytes`)."""
    return routed_pairs(model, shard, config.etp) * gemm_input * model.hidden_size


def routed_elementwise_elements(model: ModelSpec, shard: Shard, config: ParallelConfig) -> float:
    """Elements the routed side's element-wise kernels move per forward: the permutation into expert order
    and back (read + write h per pair, twice), the expert activation (swiglu: read 2f, write f; else read
    + write f, at 1/etp), the router's softmax/sigmoid and top-k over E scores per source token."""
    pairs, h, f = routed_pairs(model, shard, config.etp), model.hidden_size, model.expert_ffn_size / config.etp
    activation = 3 * f if model.ffn_kind == "swiglu" else 2 * f
    return pairs * (4 * h + activation) + 3 * source_tokens(shard) * model.num_experts


def host_time_s(model: ModelSpec, config: ParallelConfig, training: TrainingSpec) -> float:
    """Exposed host seconds of one MoE layer's pass on one device: the dispatcher's sync and launches
    (`HOST_SYNC_S`, or the engine's own where measured: `EngineProfile.moe_host_s`) and, where the engine
    launches each expert's GEMMs (`Capabilities.per_expert_launches`, not with Megatron's legacy GroupedMLP:
    `TrainingSpec.legacy_grouped_gemm`), the local experts' (`EXPERT_LAUNCH_S`); none of it under a captured
    iteration — where the engine captures the step (`spec.parallel.captured_graphs`)."""
    graphs, engine = captured_graphs(training, config), training.profile
    per_expert = (graphs != "full_iteration" and engine.capabilities.per_expert_launches
                  and not training.legacy_grouped_gemm)  # grouped_gemm's gmm: one kernel for all local experts
    sync_s = engine.moe_host_s if graphs == "none" and engine.moe_host_s is not None else HOST_SYNC_S[graphs]
    return sync_s + (EXPERT_LAUNCH_S * local_experts(model, config) if per_expert else 0.0)


# ---- communication volumes -----------------------------------------------------------------------

def deepep_outside_share(model: ModelSpec, ep: int, members_inside: int) -> float:
    """What DeepEP's normal kernels send out of the scale-up domain, as a share of an all-to-all's: a token
    crosses once per destination domain over RDMA and is forwarded to its ranks there over NVLink (DeepEP's
    internode dispatch: one RDMA copy carries the bitmask of the NVLink ranks it is for, `SourceMeta`,
    csrc/kernels/internode.cu), where an all-to-all sends each of its k copies. With its k experts spread
    evenly over D = ep / m domains, a token reaches (D − 1)·(1 − (1 − 1/D)^k) remote domains on average
    against k·(D − 1)/D copies: the share is D·(1 − (1 − 1/D)^k) / k (top-8 over 8 domains: 0.66; over 4:
    0.45). Uniform routing; DeepSeek-V3's node-limited routing (at most 4 nodes) would send fewer."""
    domains = ep // max(1, min(members_inside, ep))
    if domains <= 1 or model.top_k <= 1:
        return 1.0
    return domains * (1 - (1 - 1 / domains) ** model.top_k) / model.top_k


def dispatch_bytes(model: ModelSpec, shard: Shard, element_bytes: int) -> float:
    """What one device sends in one all-to-all (dispatch, or combine back): k copies of each source token."""
    return model.top_k * source_tokens(shard) * model.hidden_size * element_bytes


def etp_gather_bytes(model: ModelSpec, shard: Shard, config: ParallelConfig, element_bytes: int) -> float:
    """With etp > 1, the all-gathered (dispatch) or reduce-scattered (combine) tokens of one expert
    shard group: the routed pairs' hidden states."""
    return routed_pairs(model, shard, config.etp) * model.hidden_size * element_bytes


# ---- memory --------------------------------------------------------------------------------------

#: The router keeps its fp32 scores and the probabilities of the chosen experts (Megatron-core's router
#: computes in fp32: `--moe-router-dtype fp32`): 4 bytes for each of E scores, per source token.
ROUTER_SCORE_BYTES = 4


def routed_activation_bytes(model: ModelSpec, shard: Shard, config: ParallelConfig, element_bytes: int,
                            gemm_input: float | None = None, accounting: MemoryAccounting | None = None) -> float:
    """What the routed side keeps for its backward, per micro-batch: per pair the permuted input (h) and
    the expert MLP's intermediates (swiglu: gate and up in, product out, 3·f/etp; else 2·f/etp); per
    source token the router's fp32 scores (E). The grouped GEMMs' inputs (the permuted tokens, the
    activation's output) at `gemm_input` bytes (memory.gemm_input_bytes; e by default). Where the engine
    runs its SwiGLU as separate ops the SiLU's output is kept too (`MemoryAccounting.unfused_swiglu`: one more
    f), and where it scales the routed tokens by the router's weights in an fp32 op of their own, that op's
    fp32 operand (`fp32_routing_weights`: 4·h)."""
    pairs, f = routed_pairs(model, shard, config.etp), model.expert_ffn_size / config.etp
    e = element_bytes
    g = e if gemm_input is None else gemm_input
    inputs = activation_inputs(model, accounting is not None and accounting.unfused_swiglu)
    per_pair = g * model.hidden_size + f * (e * inputs + g)
    if accounting is not None and accounting.fp32_routing_weights:
        per_pair += 4 * model.hidden_size
    return pairs * per_pair + ROUTER_SCORE_BYTES * model.num_experts * source_tokens(shard)


def routed_gradient_working_bytes(model: ModelSpec, shard: Shard, config: ParallelConfig, element_bytes: int) -> float:
    """The routed experts' widest gradients in their backward: per pair the intermediate's gradient
    (3·f/etp for swiglu, else 2·f/etp) and the permuted input's (h)."""
    pairs, f = routed_pairs(model, shard, config.etp), model.expert_ffn_size / config.etp
    return pairs * element_bytes * ((3 if model.ffn_kind == "swiglu" else 2) * f + model.hidden_size)


def dispatch_buffer_bytes(model: ModelSpec, shard: Shard, config: ParallelConfig, element_bytes: int,
                          dispatcher: str = "alltoall") -> float:
    """The dispatcher's buffer in flight beside the tokens the experts receive (which are the working set's
    already), by Megatron-core's token dispatcher (TrainingSpec.moe_dispatcher):
    - alltoall (ep > 1): while an all-to-all runs — dispatch and combine, forward and backward — the tokens
      it sends exist beside those it receives (MoEAlltoAllTokenDispatcher: `permute` into a new tensor, then
      `all_to_all` into another): one more `k·tokens·h`;
    - allgather (ep·etp > 1): every token of the ep × etp group, gathered to each rank before it picks its
      experts' (MoEAllGatherTokenDispatcher: `gather_from_sequence_parallel_region` over the tp-ep group):
      `tokens·ep·etp·h`;
    - flex: none — DeepEP reads the tokens in place into the buffers it allocated once (`flex_buffer_bytes`,
      counted with the communicators); symmetric_memory likewise copies each row from the tokens straight into its
      receive buffer (MinimalAsyncEP's dispatch_op: `src_rows`, no permuted copy; `symmetric_buffer_bytes`)."""
    if dispatcher in ("flex", "symmetric_memory"):
        return 0.0
    if dispatcher == "allgather":
        return allgather_dispatch_bytes(model, shard, config, element_bytes)
    return dispatch_bytes(model, shard, element_bytes) if config.ep > 1 else 0.0


def allgather_dispatch_bytes(model: ModelSpec, shard: Shard, config: ParallelConfig, element_bytes: int) -> float:
    """The all-gather dispatcher's gathered tokens, every one of the ep × etp group's (its dispatch; the combine
    reduce-scatters as many back); none where the group is one rank."""
    group = config.ep * config.etp
    return source_tokens(shard) * group * model.hidden_size * element_bytes if group > 1 else 0.0


DEEPEP_SMS = 20
"""SMs DeepEP's normal kernels use: Megatron-LM's --moe-deepep-num-sms default (arguments.py); a channel is
two SMs."""
DEEPEP_NVL_PEERS = 8
"""DeepEP's NUM_MAX_NVL_PEERS: the ranks one NVLink buffer serves; beyond them the ranks talk over RDMA."""
DEEPEP_TOKEN_META_BYTES = 8 + 128 * 8 + 128 * 4 + 128 * 4
"""A buffered token's bookkeeping beside its hidden bytes (DeepEP csrc/config.hpp `get_nvl_buffer_size_hint`):
its source meta (8), and room for kNumMaxTopK = 128 expert indices (int64), weights and kNumMaxScales = 128
scales (fp32)."""


def deepep_recv_tokens(ranks: int) -> int:
    """Tokens per channel and peer DeepEP's NVLink buffer holds (`Buffer.get_dispatch_config`, deep_ep/buffer.py:
    256 up to 8 ranks, 288 to 64, 560 at 128, 720 beyond)."""
    return 256 if ranks <= 8 else 288 if ranks <= 64 else 560 if ranks <= 128 else 720


def flex_buffer_bytes(model: ModelSpec, config: ParallelConfig, element_bytes: int) -> float:
    """DeepEP's buffers, allocated once per process outside PyTorch's allocator (Megatron-core's fused_a2a
    `get_buffer`, sized by DeepEP's own hints, csrc/config.hpp): with c = SMs/2 channels, n = min(ep, 8)
    NVLink peers, r = ep/8 RDMA peers and per-token bytes `h·max(e, 2) + meta`,
    NVLink `c·n·T_nvl·(h·e + meta)` and, across nodes (ep > 8), RDMA `2·c·r·128·(h·e + meta + 16)` (send
    and receive halves, 128 tokens per chunk). A few hundred MB; HybridEP's are priced as DeepEP's."""
    if config.ep <= 1:
        return 0.0
    channels, token = DEEPEP_SMS // 2, model.hidden_size * max(element_bytes, 2) + DEEPEP_TOKEN_META_BYTES
    nvl = channels * min(config.ep, DEEPEP_NVL_PEERS) * deepep_recv_tokens(config.ep) * token
    rdma_peers = config.ep // DEEPEP_NVL_PEERS
    rdma = 2 * channels * rdma_peers * 128 * (token + 16) if config.ep > DEEPEP_NVL_PEERS else 0
    return float(nvl + rdma)


SYMMETRIC_RECV_BUFFERS = 2
"""MinimalAsyncEP's receive buffers, used in turn by successive exchanges (torchtitan 0.3
distributed/minimal_async_ep/api.py `_HIDDEN_RECV_BUFFER_COUNT`)."""


def symmetric_buffer_bytes(model: ModelSpec, config: ParallelConfig, max_tokens: float, element_bytes: int) -> float:
    """MinimalAsyncEP's symmetric-memory buffers, allocated once per process (api.py `init_buffer`): two receive
    buffers of `ep·T_max·min(k, E/ep)` rows of h at the parameters' 16-bit dtype (`mixed_precision_param`), T_max
    the tokens of a rank's local batch after cp and tp (token_dispatcher.py update_ep_token_dispatcher_config:
    `local_batch_size·seq_len / (cp·tp)`, every micro-batch of a pipelined step), and an ep × E int64 count
    matrix."""
    if config.ep <= 1:
        return 0.0
    rows = config.ep * max_tokens * min(model.top_k, model.num_experts // config.ep)
    return SYMMETRIC_RECV_BUFFERS * rows * model.hidden_size * max(element_bytes, 2) + 8.0 * config.ep * model.num_experts


def expert_params_per_device(model: ModelSpec, config: ParallelConfig) -> float:
    """One MoE layer's routed-expert parameters on one device: E/ep experts, 1/etp of each."""
    return local_experts(model, config) * model.expert_params() / config.etp
