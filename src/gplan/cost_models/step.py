"""One training step, composed from the per-term functions: per-stage time and memory, the pipeline
schedule, exposed data-parallel communication, the optimizer — the Prediction of plan.json (its types live in `gplan.plan`, the contract).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from gplan.cost_models import communication as comm
from gplan.cost_models import compute, experts, memory, pipeline, recompute
from gplan.errors import InputError
from gplan.plan import Prediction, StageMemory, StagePrediction, StepBreakdown
from gplan.profiles.schema import ClusterSpec, NodeGroup
from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.parallel import ParallelConfig, StageLayout, captured_graphs, empty_stage, uniform_layout
from gplan.spec.targets import dp_overlaps, overlaps_tp_comm
from gplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch, term by term: what a stage (or one layer) costs the pipeline."""

    forward_s: float
    backward_s: float
    """The backward with what it recomputes."""
    tp_s: float
    cp_s: float
    ep_s: float
    pp_s: float
    """Pipeline sends and receives (a stage's; 0 for one layer)."""

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.tp_s + self.cp_s + self.ep_s + self.pp_s


@dataclass
class StepModel:
    """Costs of one configuration; cached per layer kind and node group, so the planner can price many
    stage layouts of the same configuration cheaply."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    config: ParallelConfig
    _shared: dict = field(default_factory=dict, repr=False)
    """Values that depend only on the shard (mbs, cp, tp, sp), the expert grid (ep, etp) and the device —
    layer times, activation and working-set bytes: `sharing` gives every configuration that agrees on
    those (`sharing_key`) one dict, so that each is priced once."""

    @classmethod
    def sharing(cls, pool: dict, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                config: ParallelConfig) -> "StepModel":
        """A StepModel whose shared values live in `pool` under its own `sharing_key`: configurations of
        one search that agree on what those values depend on price each of them once — and the key is
        the model's to get right, not the caller's."""
        step = cls(model, training, cluster, config)
        step._shared = pool.setdefault(step.sharing_key, {})
        return step

    @property
    def sharing_key(self) -> tuple:
        """What every shared value depends on: the shard (mbs, sequence, tp, cp, sp), the expert grid, the
        devices and the engine that runs them, the rows the routed tensors hold (MinimalAsyncEP's buffer grows
        with a pipelined local batch) and the CUDA graphs the layout runs with (what selective layers recompute
        is in the keys of the values that depend on it: `selective_modules`) (model and training are one search's
        own)."""
        devices = tuple((g.hardware.name, g.domain_devices) for g in self.cluster.node_groups)
        c = self.config
        return (compute.shard_of(self.training, c), c.ep, c.etp, devices, self.training.engine, self.allocated_load,
                captured_graphs(self.training, c))

    def memo(self, key: tuple, price):
        """`price()`, or its value already in the shared dict under `key`."""
        try:
            return self._shared[key]
        except KeyError:
            value = self._shared[key] = price()
            return value

    @cached_property
    def shard(self) -> compute.Shard:
        return compute.shard_of(self.training, self.config)

    @cached_property
    def num_microbatches(self) -> int:
        return self.config.microbatches_for(self.training.gbs)

    @cached_property
    def kinds(self) -> dict[str, LayerKind]:
        return self.memo(("kinds",), lambda: {k.name: k for k in self.model.layer_kinds()})

    def group(self, index: int) -> NodeGroup:
        return self.cluster.node_groups[index]

    def device(self, group: int):
        """The group's device as this run's engine runs it (its engine factor and attention kernel applied):
        one copy per device and engine (shared: `sharing_key`)."""
        return self.memo(("device", group), lambda: self.group(group).hardware.for_engine(
            self.training.engine, self.training.attention_kernel_run))

    # ---- per layer ------------------------------------------------------------------------------
    def layer_time(self, kind: str, group: int) -> compute.LayerTime:
        """The layer's compute; an MoE layer's routed experts added on its busiest device."""
        return self.memo(("layer_time", kind, group), lambda: self._price_layer_time(kind, group))

    def _price_layer_time(self, kind: str, group: int) -> compute.LayerTime:
        lt = compute.layer_time(self.model, self.kinds[kind], self.training, self.shard, self.device(group))
        if self.kinds[kind].moe:
            f, b = experts.routed_time_s(self.model, self.training, self.shard, self.config, self.device(group))
            lt = compute.LayerTime(forward_s=lt.forward_s + f, backward_s=lt.backward_s + b,
                                   attention_forward_s=lt.attention_forward_s)
        return lt

    def activation_bytes_per_tensor(self) -> float:
        """One b·s·h activation on one device (the tp and pp message size)."""
        return self.shard.tokens * self.model.hidden_size * self.training.element_bytes

    def tp_allreduce_s(self, group: int) -> float:
        link = comm.axis_link(self.group(group), self.config, "tp")
        return comm.ring_allreduce_time_s(self.activation_bytes_per_tensor(), self.config.tp, link)

    def layer_tp_comm_s(self, kind: str, recompute: str, group: int) -> float:
        """2 all-reduces forward and 2 backward per attention+MLP pair (Megatron's f/g operators;
        with sp an all-gather + reduce-scatter of the same volume); full recompute replays the forward's 2;
        a cross-attention block adds one more each way. Where the engine overlaps them (`tp_overlapped`),
        each pass exposes only what its collectives take beyond its GEMMs: Transformer Engine's
        userbuffers pipeline every all-gather into the GEMM after it and every reduce-scatter out of
        the GEMM before it — the forward's GEMMs, twice their time in the backward (data and weight
        gradients), the forward's again when recomputed."""
        if self.config.tp == 1:
            return 0.0
        per_pass = 3 if self.kinds[kind].cross_attention else 2
        passes = self.tp_passes(recompute)
        # torchtitan's per-op policy keeps the reduce-scatters' outputs and replays the all-gathers: half a pass
        gathers = 0.5 if recompute == "selective" and self.config.per_op else 0.0
        if not self.tp_overlapped:
            return per_pass * (passes + gathers) * self.tp_allreduce_s(group)
        collectives_s, gemm_s = per_pass * self.tp_allreduce_s(group), self.layer_gemm_s(kind, group)
        return (sum(max(0.0, collectives_s - k * gemm_s) for k in (1, 2, 1)[:passes])
                + max(0.0, gathers * (collectives_s - gemm_s)))

    @cached_property
    def tp_overlapped(self) -> bool:
        """The engine overlaps tp's collectives with GEMMs (`spec.targets.overlaps_tp_comm`: one switch for
        the whole job, whatever node group a stage runs on)."""
        return overlaps_tp_comm(self.training, self.config, self.cluster.smallest_domain_devices)

    def layer_gemm_s(self, kind: str, group: int) -> float:
        """The forward GEMMs of one layer on one tp rank at the training precision (cost_models.compute)."""
        return self.memo(("gemm_s", kind, group), lambda: sum(
            compute.gemm_time_s(self.device(group), self.training.precision, g)
            for g in compute.layer_gemms(self.model, self.kinds[kind], self.shard)))

    def layer_cp_comm_s(self, kind: str, group: int) -> float:
        """Ring attention passes K and V around the cp ring (`(cp−1)·2·b·(s/cp)·h_kv/t` bytes forward,
        twice that backward), overlapped with the attention core; only the excess is exposed."""
        if self.config.cp == 1:
            return 0.0
        cp = self.config.cp
        kv_bytes = 2 * self.shard.tokens * self.model.kv_hidden_size / self.config.tp * self.training.element_bytes
        link = comm.axis_link(self.group(group), self.config, "cp")
        send_s = (cp - 1) * comm.p2p_time_s(kv_bytes, link) * 3
        lt = self.layer_time(kind, group)
        overlap_s = lt.attention_forward_s * (1 + compute.FLASH_BACKWARD_FLOP_RATIO)
        return max(0.0, send_s - overlap_s)

    @cached_property
    def routed_load(self) -> float:
        """The busiest device's routed tokens over the balanced share (experts.routed_load: the imbalance, capped or
        padded to the expert capacity; 1 without expert parallelism)."""
        return experts.routed_load(self.model, self.training, self.config.ep)

    @cached_property
    def allocated_load(self) -> float:
        """The rows the busiest device's routed tensors hold over the balanced share (experts.allocated_load: the
        routed load, or the capacity an exchange sized without the host allocates)."""
        return experts.allocated_load(self.model, self.training, self.config.ep, self.buffered_microbatches)

    @cached_property
    def buffered_microbatches(self) -> int:
        """The micro-batches a rank's local batch holds, which torchtitan sizes its kernel exchanges' buffers for
        (update_ep_token_dispatcher_config: local batch · seq / (cp·tp)): a pipelined step's all, else one."""
        return self.num_microbatches if self.config.pp > 1 else 1

    def layer_ep_comm_s(self, kind: str, recompute: str, group: int) -> float:
        """An MoE layer's token traffic: dispatch and combine, each an all-to-all over ep (and with etp an
        all-gather, resp. reduce-scatter, over etp), in the forward and again in the backward; full
        recompute replays the forward's; scaled by the routing imbalance, and under Megatron's
        `--overlap-moe-expert-parallel-comm` only its exposed share. Each pass adds the host time the
        layer exposes (experts.host_time_s; `host_passes`). The all-gather dispatcher instead gathers every token of the
        ep × etp group and reduce-scatters as many back, whatever the routing, at the ring's own speed (the
        fitted ALLTOALL_EFFICIENCY is the all-to-all's and DeepEP's); flex is priced as the all-to-all but for
        what leaves the scale-up domain, which DeepEP sends once per destination domain (deepep_outside_share)."""
        if not self.kinds[kind].moe:
            return 0.0
        c, g, e = self.config, self.group(group), self.training.element_bytes
        if self.training.moe_dispatcher == "allgather":  # every token of the ep × etp group, to each rank
            a2a = comm.allgather_time_s(experts.allgather_dispatch_bytes(self.model, self.shard, c, e), c.ep * c.etp,
                                        comm.expert_axis_link(g, c, "ep" if c.ep > 1 else "etp"))
            etp_s, efficiency = 0.0, 1.0
        else:
            sent = experts.dispatch_bytes(self.model, self.shard, e) * self.routed_load
            inside = comm.expert_members_per_domain(c, "ep", g.domain_devices)
            share = experts.deepep_outside_share(self.model, c.ep, inside) if self.training.moe_dispatcher == "flex" else 1.0
            a2a = comm.alltoall_time_s(sent, c.ep, inside, g.intra_node, g.inter_node, share)
            gathered = experts.etp_gather_bytes(self.model, self.shard, c, e) * self.routed_load
            etp_s = comm.allgather_time_s(gathered, c.etp, comm.expert_axis_link(g, c, "etp"))
            efficiency = experts.ALLTOALL_EFFICIENCY
        passes = self.ep_passes(recompute)
        exposed = experts.OVERLAPPED_ALLTOALL_EXPOSED if self.training.moe_a2a_overlap else 1.0
        host_s = experts.host_time_s(self.model, c, self.training)
        exchange_s = (a2a + etp_s) * exposed / efficiency
        hidden_s = (passes - 1) * self.shared_expert_hides_s(exchange_s, 1.0, group) + \
            self.shared_expert_hides_s(exchange_s, compute.GEMM_BACKWARD_FLOP_RATIO, group)
        return passes * 2 * exchange_s + self.host_passes(recompute) * host_s - hidden_s

    def shared_expert_hides_s(self, exchange_s: float, ratio: float, group: int) -> float:
        """What of one pass's token exchange the shared experts hide under `--moe-shared-expert-overlap`: their
        first GEMM (and activation) runs beside the dispatch, their second beside the combine, on their own stream
        (megatron-core's SharedExpertMLP: linear_fc1_forward_and_act during the dispatch all-to-all,
        linear_fc2_forward during the combine), each hiding as much of its all-to-all as it lasts; the backward's
        GEMMs (`ratio` 2: input and weight gradients) likewise. 0 without the overlap or shared experts."""
        if not (self.training.moe_shared_expert_overlap and self.model.shared_expert_ffn_size):
            return 0.0
        device = self.device(group)
        fc1, fc2 = compute.mlp_gemms(self.model, self.model.shared_expert_ffn_size, self.shard)
        return sum(min(exchange_s, ratio * compute.gemm_time_s(device, self.training.precision, g)) for g in (fc1, fc2))

    def selective_modules(self, option: str) -> tuple[str, ...]:
        """The modules a layer recomputing with `option` replays: the configuration's for selective, none else
        (a memo key: configurations that differ only in their modules share every other value)."""
        return self.config.recompute_modules if option == "selective" else ()

    @staticmethod
    def tp_passes(option: str) -> int:
        """Passes a layer's tp collectives run in: forward and backward, and the forward again under full recompute."""
        return 3 if option == "full" else 2

    def ep_passes(self, option: str) -> int:
        """Passes an MoE layer's token exchange runs in: forward and backward, and the forward again where the
        layer is replayed (`replays_moe_layer`)."""
        return 3 if self.replays_moe_layer(option) else 2

    def host_passes(self, option: str) -> int:
        """Passes in which an MoE layer's host time shows (experts.host_time_s): its exchange's, and one more under
        torchtitan's per-op policy, which keeps the exchange's outputs but runs the block's forward again from
        Python in the backward (torch.utils.checkpoint with a policy: a kept op's result is handed back, every op
        still dispatched)."""
        return self.ep_passes(option) + (1 if option == "selective" and self.config.per_op else 0)

    def replays_moe_layer(self, option: str) -> bool:
        """Whether the backward replays the MoE layer's forward, its token traffic included: full recompute,
        or selective with the `moe` module."""
        return option == "full" or (option == "selective" and "moe" in self.config.recompute_modules)

    def layer_params(self, kind: str) -> float:
        """One layer's parameters on one device: attention, norms, router and shared experts after tp;
        an MoE layer's routed experts after ep and etp."""
        return self.memo(("layer_params", kind), lambda: self._count_layer_params(kind))

    def _count_layer_params(self, kind: str) -> float:
        k = self.kinds[kind]
        if not k.moe:
            return self.model.layer_params_per_rank(k, self.config.tp)
        routed_after_tp = self.model.num_experts * self.model.expert_params() / self.config.tp
        return self.model.layer_params_per_rank(k, self.config.tp) - routed_after_tp + self.layer_expert_params(kind)

    def layer_expert_params(self, kind: str) -> float:
        """The routed-expert part of `layer_params`: sharded for the optimizer over edp, not dp·cp."""
        return experts.expert_params_per_device(self.model, self.config) if self.kinds[kind].moe else 0.0

    def stage_expert_params(self, stage: StageLayout) -> float:
        return sum(c.count * self.layer_expert_params(c.kind) for c in stage.layers) + self.stage_fixed_expert_params(stage)

    def stage_fixed_expert_params(self, stage: StageLayout) -> float:
        """The routed experts among `stage_fixed_params`: the MTP depths' on the last stage."""
        return self.mtp_expert_params() if stage.head else 0.0

    def layer_activation_bytes(self, kind: str, recompute: str) -> float:
        """What a layer keeps per micro-batch in flight; an MoE layer's routed side beside it (the whole
        layer's input only under full recompute)."""
        return self.memo(("activation", kind, recompute, self.selective_modules(recompute)),
                         lambda: self._price_activation_bytes(kind, recompute))

    def _price_activation_bytes(self, kind: str, recompute: str) -> float:
        """A selective layer keeps what a layer recomputing nothing keeps, less what its modules drop."""
        t = self.training
        g, accounting = memory.gemm_input_bytes(t), t.profile.memory
        kept = memory.layer_activation_bytes(self.model, self.kinds[kind], self.shard, t.element_bytes,
                                             t.flash_attention, "none" if recompute == "selective" else recompute, g,
                                             accounting.unfused_swiglu)
        if self.kinds[kind].moe and recompute != "full":
            kept += self.allocated_load * experts.routed_activation_bytes(self.model, self.shard, self.config,
                                                                         t.element_bytes, g, accounting)
        if recompute == "selective":
            kept -= sum(self.module_drops(kind))
        return kept

    def module_drops(self, kind: str) -> list[float]:
        """What each module a selective layer of `kind` recomputes takes off its kept bytes (cost_models.recompute);
        torchtitan's per-op policy drops all but what it keeps (`recompute.per_op_kept_bytes`)."""
        t = self.training
        if self.config.per_op:
            kept = recompute.per_op_kept_bytes(self.model, self.kinds[kind], self.shard, self.config, t.element_bytes,
                                               t.precision, self.allocated_load)
            return [max(0.0, self.layer_activation_bytes(kind, "none") - kept)]
        return recompute.module_drops(self.config.recompute_modules, self.model, self.kinds[kind], self.shard, self.config,
                                      t.element_bytes, t.flash_attention, self.allocated_load, memory.gemm_input_bytes(t))

    # ---- per stage --------------------------------------------------------------------------------
    def stage_fixed_params(self, stage: StageLayout) -> float:
        """Embedding on the first stage; head on the last (a tied head keeps its own copy of the
        embedding when the two sit on different stages, as Megatron-LM does); per tp rank, with the
        vocabulary split over tp and positions and the final norm replicated."""
        tp, params = self.config.tp, 0.0
        if stage.embedding:
            params += self.model.embedding_params_per_rank(tp)
        if stage.head:
            params += self.model.head_params_per_rank(tp) + self.mtp_params()
            # a tied head, or MTP's embedding of the shifted tokens, keeps its own copy of the embedding
            # when the two ends sit on different stages (Megatron-LM's shared embedding weight)
            if (self.model.tie_embeddings or self.model.mtp_layers) and not stage.embedding:
                params += self.model.vocab_size * self.model.hidden_size / tp
        return params

    # ---- multi-token prediction (DeepSeek-V3 §2.2; Megatron's MultiTokenPredictionBlock) ------------
    # Each depth on the last stage: a layer of the model's last kind, the 2h → h projection over its
    # norms (column-parallel, /tp), and the output head once more on its shifted tokens.
    def mtp_params(self) -> float:
        m = self.model
        if not m.mtp_layers:
            return 0.0
        extra = 2 * m.hidden_size * m.hidden_size / self.config.tp + 3 * m.norm_params()
        return m.mtp_layers * (self.layer_params(m.mtp_kind.name) + extra)

    def mtp_expert_params(self) -> float:
        return self.model.mtp_layers * self.layer_expert_params(self.model.mtp_kind.name)

    def mtp_times(self, group: int) -> tuple[float, float]:
        """(forward, backward) seconds of the MTP depths per micro-batch."""
        m = self.model
        if not m.mtp_layers:
            return 0.0, 0.0
        lt = self.layer_time(m.mtp_kind.name, group)
        projection = compute.Gemm(self.shard.tokens, m.hidden_size // self.config.tp, 2 * m.hidden_size)
        proj_s = compute.gemm_time_s(self.device(group), self.training.precision, projection)
        head_f, head_b = self.end_time("head", group)
        return (m.mtp_layers * (lt.forward_s + proj_s + head_f),
                m.mtp_layers * (lt.backward_s + compute.GEMM_BACKWARD_FLOP_RATIO * proj_s + head_b))

    def stage_params(self, stage: StageLayout) -> float:
        return sum(c.count * self.layer_params(c.kind) for c in stage.layers) + self.stage_fixed_params(stage)

    def pp_send_s(self, group: int) -> float:
        """One activation (or its gradient) to the neighbour stage; with tp, each rank sends its 1/t
        slice (Megatron's scatter-gather optimisation, Narayanan et al. 2021, §4.1)."""
        link = comm.pipeline_link(self.group(group), self.config)
        return comm.p2p_time_s(self.activation_bytes_per_tensor() / self.config.tp, link)

    def stage_sends(self, stage: StageLayout) -> int:
        """Sends per micro-batch: forward out (all but the last stage) and gradient back (all but the
        first), once per virtual chunk."""
        if self.config.pp == 1:
            return 0
        return 2 * self.config.vpp - int(stage.embedding) - int(stage.head)

    def in_flight(self, index: int) -> float:
        c = self.config
        return pipeline.in_flight_microbatches(index, c.pp, self.num_microbatches // c.schedule_runs, c.schedule, c.vpp)

    def compute_times(self, layout: StageLayout) -> tuple[float, float]:
        """(forward, backward incl. recompute) seconds of one micro-batch: its layers, then the embedding
        and head it holds."""
        g = layout.node_group
        forward = backward = 0.0
        for c in layout.layers:
            one = self.layer_times(c.kind, c.recompute, g)
            forward += c.count * one.forward_s
            backward += c.count * one.backward_s
        for held, part in ((layout.embedding, "embedding"), (layout.head, "head")):
            if held:
                f, b = self.end_time(part, g)
                forward, backward = forward + f, backward + b
        if layout.head:
            f, b = self.mtp_times(g)
            forward, backward = forward + f, backward + b
        return forward, backward

    def end_time(self, part: str, group: int) -> tuple[float, float]:
        """(forward, backward) seconds of the embedding or the head: like a layer's, shard-level."""
        time_of = compute.embedding_time if part == "embedding" else compute.head_time
        return self.memo(("end_time", part, group),
                         lambda: time_of(self.model, self.training, self.shard, self.device(group)))

    def layer_times(self, kind: str, option: str, group: int) -> StageTimes:
        """One layer of `kind` recomputing with `option`, per micro-batch: the one composition of a layer's
        time — its compute, recompute and the collectives it waits on — that the stages' times, the ILP's
        cost table and the bounds all sum (no pipeline sends: those are the stage's)."""
        lt = self.layer_time(kind, group)
        return StageTimes(forward_s=lt.forward_s, backward_s=lt.backward_s + self.layer_recompute_s(kind, option, group),
                          tp_s=self.layer_tp_comm_s(kind, option, group), cp_s=self.layer_cp_comm_s(kind, group),
                          ep_s=self.layer_ep_comm_s(kind, option, group), pp_s=0.0)

    def layer_recompute_s(self, kind: str, option: str, group: int) -> float:
        """The forward a layer's backward replays: all of it under full recompute; under selective, each
        recomputed module's piece (`module_replay_s`)."""
        if option == "full":
            return self.layer_time(kind, group).forward_s
        if option != "selective":
            return 0.0
        modules = recompute.effective_modules(self.config.recompute_modules)
        return sum(self.memo(("replay", kind, m, group), lambda m=m: self.module_replay_s(kind, m, group)) for m in modules)

    def module_replay_s(self, kind: str, module: str, group: int) -> float:
        """One module's forward, from the pieces the layer's time is made of: the attention core; the GEMMs
        of the dense MLP, the shared experts or latent attention's up-projections with their element-wise
        traffic; the routed experts' forward (their token traffic is `layer_ep_comm_s`'s); the activation
        and norms at HBM speed."""
        k, device, e = self.kinds[kind], self.device(group), self.training.element_bytes
        gemms_s = lambda gs: sum(compute.gemm_time_s(device, self.training.precision, g) for g in gs)
        tokens = self.shard.tokens
        act = 3 if self.model.ffn_kind == "swiglu" else 2
        if module == "core_attn":
            return self.layer_time(kind, group).attention_forward_s
        if module == "layernorm":  # two norms, each reading and writing h per token
            return compute.memory_time_s(device, 4 * tokens * self.model.hidden_size * e / (self.shard.tp if self.shard.sp else 1))
        if module in ("mlp", "shared_experts"):
            width = memory.mlp_width(self.model, k)
            if (module == "mlp") == k.moe or not width:
                return 0.0
            return (gemms_s(compute.mlp_gemms(self.model, width, self.shard))
                    + compute.memory_time_s(device, act * tokens * width * e / self.shard.tp))
        if module == "moe_act":
            if not k.moe:
                return 0.0
            pairs = experts.routed_pairs(self.model, self.shard, self.config.etp)
            return compute.memory_time_s(device, act * pairs * self.model.expert_ffn_size / self.config.etp * e)
        if module == "moe":
            if not k.moe:
                return 0.0
            routed_f, _ = experts.routed_time_s(self.model, self.training, self.shard, self.config, device)
            return routed_f + gemms_s(compute.moe_dense_gemms(self.model, self.shard))
        if module == "mla_up_proj":
            return gemms_s(compute.latent_up_gemms(self.model, self.shard)) if self.model.is_mla else 0.0
        if module == "op":
            return self.per_op_replay_s(kind, group)
        raise ValueError(f"unknown recompute module {module}")

    def per_op_replay_s(self, kind: str, group: int) -> float:
        """What torchtitan's per-op policy replays of a block: the GEMMs it did not keep, every element-wise
        kernel (norms, rotary, activation, residuals) and the launches, and an MoE layer's routed experts (its
        grouped GEMMs are not saved; the all-to-all's outputs are). Attention is kept."""
        k, device, t = self.kinds[kind], self.device(group), self.training
        _, replayed = recompute.per_op_split(self.model, k, self.shard, t.precision)
        gemm_s = sum(compute.gemm_time_s(device, t.precision, g) for g in replayed)
        elementwise_s = compute.memory_time_s(device, compute.layer_elementwise_elements(self.model, k, self.shard)
                                              * t.element_bytes)
        routed_s = experts.routed_time_s(self.model, t, self.shard, self.config, device)[0] if k.moe else 0.0
        return gemm_s + elementwise_s + device.efficiency.layer_overhead_s + routed_s

    def offloaded_layer_bytes(self, layout: StageLayout) -> list[float]:
        """The activations of each layer offloaded to host memory (`offload_layers`: the first N of the model,
        which with pp = 1 are this stage's first N), per micro-batch."""
        left, out = self.config.offload_layers, []
        for c in layout.layers:
            n = min(left, c.count)
            out += [self.layer_activation_bytes(c.kind, c.recompute)] * n
            left -= n
        return out

    def offload_exposed_s(self, layout: StageLayout, forward_s: float, backward_s: float) -> tuple[float, float]:
        """(forward, backward) seconds activation offloading adds to a micro-batch: the offloaded bytes go to
        the host during the forward and come back during the backward, each direction at the device's host
        link, overlapped with the compute beside it; only what the transfer takes beyond it shows."""
        moved = sum(self.offloaded_layer_bytes(layout))
        if not moved:
            return 0.0, 0.0
        link = self.group(layout.node_group).hardware.host_link_GBps
        if link is None:
            raise InputError(f"{self.group(layout.node_group).hardware.name} states no host link bandwidth, so "
                             "activation offloading cannot be priced on it", hint="offload_layers=0, or add "
                             "host_link_GBps to the hardware file")
        transfer_s = moved / (link * 1e9)
        return max(0.0, transfer_s - forward_s), max(0.0, transfer_s - backward_s)

    def stage_times(self, layout: StageLayout) -> StageTimes:
        """Seconds of one micro-batch on a stage: its layers (`layer_times`), the embedding and head it
        holds (with their all-reduce over tp), the MTP depths on the last, and its pipeline sends."""
        g = layout.node_group
        forward, backward = self.compute_times(layout)
        tp_s = cp_s = ep_s = 0.0
        for c in layout.layers:
            one = self.layer_times(c.kind, c.recompute, g)
            tp_s, cp_s, ep_s = tp_s + c.count * one.tp_s, cp_s + c.count * one.cp_s, ep_s + c.count * one.ep_s
        for held in (layout.embedding, layout.head):  # their all-reduce over tp
            if held and self.config.tp > 1:
                tp_s += self.tp_allreduce_s(g)
        if layout.head and self.model.mtp_layers:  # each MTP depth: its layer's collectives and its head's
            kind, depths = self.model.mtp_kind.name, self.model.mtp_layers
            tp_s += depths * (self.layer_tp_comm_s(kind, "none", g) + (self.tp_allreduce_s(g) if self.config.tp > 1 else 0))
            ep_s += depths * self.layer_ep_comm_s(kind, "none", g)
        offload_f, offload_b = self.offload_exposed_s(layout, forward, backward)
        return StageTimes(forward + offload_f, backward + offload_b, tp_s, cp_s, ep_s,
                          self.stage_sends(layout) * self.pp_send_s(g))

    def stage(self, index: int, layout: StageLayout) -> StagePrediction:
        g = layout.node_group
        times = self.stage_times(layout)
        params = self.stage_params(layout)
        mem = self.stage_memory(index, layout, params, self.stage_activation_bytes(index, layout))
        return StagePrediction(
            index=index, num_layers=layout.num_layers, node_group=g, forward_s=times.forward_s,
            backward_s=times.backward_s, tp_comm_s=times.tp_s, cp_comm_s=times.cp_s, ep_comm_s=times.ep_s,
            pp_comm_s=times.pp_s, time_s=times.total_s, in_flight=self.in_flight(index), params=params,
            expert_params=self.stage_expert_params(layout),
            memory=mem, memory_bytes=mem.total_bytes, memory_budget_bytes=self.memory_budget(g),
        )

    def stage_activation_bytes(self, index: int, layout: StageLayout) -> float:
        """Activations kept by stage `index`: its layers' and its embedding's per micro-batch in flight;
        the head's logits for one micro-batch (all of them under GPipe)."""
        in_flight = self.in_flight(index)
        activations = in_flight * sum(c.count * self.layer_activation_bytes(c.kind, c.recompute)
                                      for c in layout.layers)
        offloaded = self.offloaded_layer_bytes(layout)
        if offloaded:  # in host memory but the layer in transit (Megatron's offload handler double-buffers)
            activations -= in_flight * sum(offloaded) - max(offloaded)
        if layout.embedding:
            activations += in_flight * memory.embedding_activation_bytes(self.model, self.shard)
        if layout.head:
            head_held = self.num_microbatches if self.config.schedule == "gpipe" else 1
            head = memory.head_activation_bytes(self.model, self.shard, self.training.element_bytes, self.training.profile,
                                                self.training.bf16_loss, self.training.compiled_loss,
                                                self.training.loss_chunks_run)
            activations += head_held * head
            if self.model.mtp_layers:  # each depth keeps a layer's activations per micro-batch in flight, and its logits
                depth = in_flight * self.layer_activation_bytes(self.model.mtp_kind.name, "none") + head_held * head
                activations += self.model.mtp_layers * depth
        return activations

    @cached_property
    def state_bytes(self) -> memory.StateBytes:
        c, t = self.config, self.training
        return memory.state_bytes_per_param(t.element_bytes, c.zero, memory.zero_shard_ranks(c), t.profile,
                                            bf16=t.precision == "bf16", grad_bytes=t.grad_bytes, pure_bf16=t.pure_bf16,
                                            optimizer_in_backward=t.optimizer_in_backward,
                                            unsharded_grads=self.accumulates_unsharded,
                                            stays_gathered=self.reduces_after_last_backward,
                                            adam_bytes=memory.device_adam_bytes(t), offloaded=t.fsdp_offload)

    @property
    def accumulates_unsharded(self) -> bool:
        """Whether sharded data parallel holds whole gradients across micro-batches, reducing them once: under
        torch's pipelining (`reduces_after_last_backward`), or without stages where the engine lifts gradient sync
        only on a step's last micro-batch and there are several (`EngineProfile.defers_grad_sync`)."""
        return self.reduces_after_last_backward or self.defers_grad_sync

    @property
    def reduces_after_last_backward(self) -> bool:
        """Whether sharded data parallel reduces a stage's gradients only after its last backward of a run,
        exposed, the weights left gathered by every backward: with pipeline stages on an engine that pipelines as
        torch does (`EngineProfile.pipeline_reduce_after_backward`: it lifts no_sync only then)."""
        return self.config.pp > 1 and self.config.zero >= 1 and self.training.profile.pipeline_reduce_after_backward

    @property
    def defers_grad_sync(self) -> bool:
        """Without stages, whether a step's gradients are reduced behind its last micro-batch's backward only,
        accumulated whole before (`EngineProfile.defers_grad_sync`; one micro-batch reduces as it goes)."""
        c = self.config
        t = self.training
        return (c.pp == 1 and c.zero >= 1 and self.num_microbatches > 1 and t.profile.defers_grad_sync
                and not t.grad_sync_each_microbatch)

    @cached_property
    def reduced_grad_bytes(self) -> int:
        """Bytes per gradient element the data-parallel reduction moves (`memory.reduced_grad_bytes`)."""
        c, t = self.config, self.training
        return memory.reduced_grad_bytes(t.element_bytes, c.zero, t.profile, bf16=t.precision == "bf16",
                                         grad_bytes=t.grad_bytes, pure_bf16=t.pure_bf16)

    @cached_property
    def expert_state_bytes(self) -> memory.StateBytes:
        """Per routed-expert parameter: sharded over the expert data-parallel ranks (edp), not dp·cp."""
        c, t = self.config, self.training
        return memory.state_bytes_per_param(t.element_bytes, c.zero, c.edp, t.profile, bf16=t.precision == "bf16",
                                            grad_bytes=t.grad_bytes, pure_bf16=t.pure_bf16,
                                            optimizer_in_backward=t.optimizer_in_backward,
                                            unsharded_grads=self.accumulates_unsharded,
                                            stays_gathered=self.reduces_after_last_backward,
                                            adam_bytes=memory.device_adam_bytes(t), offloaded=t.fsdp_offload)

    def states(self, params: float, expert_params: float) -> tuple[float, float, float]:
        """(weights, grads, optimizer) bytes of `params` on one device, `expert_params` of them routed experts."""
        dense, routed, rest = self.state_bytes, self.expert_state_bytes, params - expert_params
        return (rest * dense.weights + expert_params * routed.weights, rest * dense.grads + expert_params * routed.grads,
                rest * dense.optimizer + expert_params * routed.optimizer)

    def layer_state_bytes(self, kind: str) -> float:
        """Weights, gradients and optimizer state of one layer on one device, with the quantised weight
        copies of an FP8 recipe."""
        params = self.layer_params(kind)
        return sum(self.states(params, self.layer_expert_params(kind))) + \
            params * memory.layer_weight_copy_bytes(self.training, self.config)

    def layer_transient_bytes(self, kind: str, recompute: str) -> float:
        """The working set while one layer of this kind runs its backward (recompute + gradients)."""
        return self.memo(("transient", kind, recompute, self.selective_modules(recompute)),
                         lambda: self._price_transient_bytes(kind, recompute))

    def _price_transient_bytes(self, kind: str, recompute: str) -> float:
        t = self.training
        replayed = (max(self.module_drops(kind), default=0.0) if recompute == "selective" else
                    memory.recompute_working_bytes(self.model, self.kinds[kind], self.shard, t.element_bytes,
                                                   t.flash_attention, recompute, t.profile.memory.unfused_swiglu))
        working = replayed + memory.gradient_working_bytes(self.model, self.shard, t.element_bytes, self.kinds[kind])
        if self.kinds[kind].moe:
            routed = (experts.routed_gradient_working_bytes(self.model, self.shard, self.config, t.element_bytes)
                      + experts.dispatch_buffer_bytes(self.model, self.shard, self.config, t.element_bytes,
                                                      t.moe_dispatcher))
            if recompute == "full":  # the replayed forward recreates the routed side's activations too
                routed += experts.routed_activation_bytes(self.model, self.shard, self.config, t.element_bytes,
                                                          accounting=t.profile.memory)
                if t.moe_dispatcher == "symmetric_memory":  # its input is the receive buffer, counted once
                    routed -= experts.routed_input_bytes(self.model, self.shard, self.config, t.element_bytes)
            working += self.allocated_load * routed
        return working

    def head_transient_bytes(self, layout: StageLayout) -> float:
        t = self.training
        return memory.loss_working_bytes(self.model, self.shard, t.element_bytes, t.profile, t.bf16_loss,
                                         t.compiled_loss, t.loss_chunks_run) \
            if layout.head else 0.0

    def stage_transient_bytes(self, layout: StageLayout) -> float:
        """The largest working set of the stage's backward: its heaviest layer's, or the loss's."""
        layers = [self.layer_transient_bytes(c.kind, c.recompute) for c in layout.layers if c.count]
        return max(layers + [self.head_transient_bytes(layout)])

    def unit_params(self, layout: StageLayout) -> list[float]:
        """The stage's zero-3 units: each layer, and the embedding and head where it holds them."""
        units = [self.layer_params(c.kind) for c in layout.layers if c.count]
        tp = self.config.tp
        if layout.embedding:
            units.append(self.model.embedding_params_per_rank(tp))
        if layout.head:
            units.append(self.stage_fixed_params(empty_stage(False, True)))
        return units

    def fragmentation(self, group: int) -> float:
        return memory.fragmentation_fraction(self.group(group).hardware.fragmentation, self.training.profile,
                                             self.config.zero)

    def communicator_bytes(self, group: int) -> float:
        """NCCL's buffers per communicator, and DeepEP's under the flex dispatcher or MinimalAsyncEP's symmetric
        memory (allocated once, outside PyTorch's caching allocator's reuse, as NCCL's are)."""
        c, t = self.config, self.training
        tied_pair = self.model.tie_embeddings and c.pp > 1
        nccl = memory.communicator_count(c, tied_pair, self.model.is_moe) * self.group(group).hardware.communicator_MiB * 2**20
        if not self.model.is_moe:
            return nccl
        if t.moe_dispatcher == "symmetric_memory":  # a rank's local batch: every micro-batch of a pipelined step
            max_tokens = self.shard.tokens / self.shard.tp * self.buffered_microbatches
            return nccl + experts.symmetric_buffer_bytes(self.model, c, max_tokens, t.element_bytes)
        return nccl + (experts.flex_buffer_bytes(self.model, c, t.element_bytes) if t.moe_dispatcher == "flex" else 0.0)

    def stage_memory(self, index: int, layout: StageLayout, params: float, activations: float) -> StageMemory:
        c, t = self.config, self.training
        device = self.group(layout.node_group).hardware
        buffers = memory.engine_buffer_bytes(t.profile, c.zero, t.element_bytes, params)
        if c.zero >= 3 and memory.zero_shard_ranks(c) > 1:
            buffers += memory.zero3_gather_buffer_bytes(self.unit_params(layout), t.element_bytes, t.profile)
        transient = self.stage_transient_bytes(layout)
        weights, grads, optimizer = self.states(params, self.stage_expert_params(layout))
        layer_params = sum(c.count * self.layer_params(c.kind) for c in layout.layers)
        if layout.head:  # the MTP depths' layers are quantised like the model's
            layer_params += self.model.mtp_layers * self.layer_params(self.model.mtp_kind.name)
        weights += layer_params * memory.layer_weight_copy_bytes(t, c)
        allocated = weights + grads + optimizer + activations + buffers + transient
        return StageMemory(
            weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optimizer, activations_bytes=activations,
            buffers_bytes=buffers, reserve_bytes=device.reserve_GiB * 1024**3, transient_bytes=transient,
            communicator_bytes=self.communicator_bytes(layout.node_group),
            fragmentation_bytes=memory.fragmentation_bytes(allocated, self.fragmentation(layout.node_group)),
        )

    def memory_budget(self, group: int) -> float:
        return self.group(group).hardware.memory_bytes * (1 - self.training.memory_headroom)

    # ---- data parallel and optimizer --------------------------------------------------------------
    def dp_exposed_s(self, stage: StagePrediction, layout: StageLayout | None = None) -> float:
        """Gradient synchronisation of one stage's parameters over its dp·cp ranks, minus what hides
        behind compute (`dp_sync_exposed_s`; zero 3 (FSDP) with a layout: `zero3_exposed_s`, unit by
        unit), and the tied embedding's all-reduce."""
        c = self.config
        tied = self.tied_embedding_s(layout) if layout is not None else 0.0
        ranks = memory.zero_shard_ranks(c)
        if c.zero >= 3 and layout is not None and ranks > 1:
            link = comm.axis_link(self.group(stage.node_group), c, "dp")
            return self.zero3_exposed_s(layout, ranks, link) + tied
        return self.dp_sync_exposed_s(stage.params, stage.forward_s, stage.backward_s, stage.node_group,
                                      stage.expert_params) + tied

    def dp_sync_exposed_s(self, params: float, forward_s: float, backward_s: float, group: int,
                          expert_params: float = 0.0) -> float:
        """What of a stage's data-parallel synchronisation (its params, its forward and backward per
        micro-batch) compute does not hide. zero 0: the all-reduce overlapped with the last micro-batch's
        backward; zero 1/2: the reduce-scatter there, and the parameter all-gather behind the first
        forward (unless the engine does not overlap it at this precision: `overlaps_param_gather`) — each
        exposed whole where the run does not overlap it (`spec.targets.dp_overlaps`: a Megatron-LM launch without
        --overlap-grad-reduce / --overlap-param-gather); zero 3
        as one unit per micro-batch. Routed-expert parameters (`expert_params` of
        `params`) synchronise over the edp ranks, the rest over dp·cp, one after the other. A schedule run
        once per local batch (`ParallelConfig.schedule_runs`: torchtitan's and NeMo AutoModel's loops over
        `schedule.step`) synchronises once per run: torch's pipeline stages lift `no_sync` on each run's last
        backward (DDP all-reduces, FSDP reduce-scatters and reshards, so the next run gathers again); zero 3's
        collectives are per micro-batch already."""
        return self.syncs_per_step * self._one_sync_exposed_s(params, forward_s, backward_s, group, expert_params)

    @property
    def syncs_per_step(self) -> int:
        """How often zero 0–2 synchronise a stage's gradients a step: once per schedule run with stages; without,
        once per micro-batch where the engine reduces every one (`EngineProfile.reduces_every_microbatch`); zero
        3's collectives are counted per micro-batch already (1)."""
        c = self.config
        if c.zero >= 3:
            return 1
        if c.pp == 1 and c.zero >= 1 and (self.training.profile.reduces_every_microbatch
                                          or self.training.grad_sync_each_microbatch):
            return self.num_microbatches
        return c.schedule_runs

    def _one_sync_exposed_s(self, params: float, forward_s: float, backward_s: float, group: int,
                            expert_params: float) -> float:
        c, e = self.config, self.training.element_bytes
        groups = [(params - expert_params, memory.zero_shard_ranks(c), comm.axis_link(self.group(group), c, "dp")),
                  (expert_params, c.edp, comm.expert_axis_link(self.group(group), c, "edp"))]
        groups = [(p, n, link) for p, n, link in groups if n > 1 and p > 0]
        if not groups:
            return 0.0
        # else after the backward, resp. before the forward (Megatron-LM without --overlap-grad-reduce / -param-gather)
        reduced_behind, gathered_behind = dp_overlaps(self.training, c)
        if c.zero == 0:
            allreduce = sum(comm.ring_allreduce_time_s(p * self.reduced_grad_bytes, n, link) for p, n, link in groups)
            return max(0.0, allreduce - (backward_s if reduced_behind else 0.0))
        gather = sum(comm.allgather_time_s(p * e, n, link) for p, n, link in groups)
        scatter = sum(comm.reduce_scatter_time_s(p * self.reduced_grad_bytes, n, link) for p, n, link in groups)
        if c.zero < 3:
            hidden_s = forward_s if gathered_behind else 0.0
            # torch's pipelining reduces a stage's gradients after its last backward, not beside it
            behind_s = 0.0 if self.reduces_after_last_backward or not reduced_behind else backward_s
            return max(0.0, scatter - behind_s) + max(0.0, gather - hidden_s)
        if self.reduces_after_last_backward:  # torch's pipelining: one gather a micro-batch, one reduce-scatter a run
            return self.num_microbatches * max(0.0, gather - backward_s) + c.schedule_runs * scatter
        per_mb = max(0.0, gather - forward_s) + max(0.0, gather + scatter - backward_s)
        if self.defers_grad_sync:  # the reduce-scatter behind the last micro-batch's backward only
            unreduced = max(0.0, gather - forward_s) + max(0.0, gather - backward_s)
            return (self.num_microbatches - 1) * unreduced + per_mb
        return self.num_microbatches * per_mb

    def tied_embedding_s(self, layout: StageLayout) -> float:
        """A tied embedding and head on different stages: their fp32 gradients (V·h/t) are all-reduced
        between the first and the last stage after the backward, before the optimizer (Megatron's
        embedding group, `_allreduce_word_embedding_grads`): not overlapped."""
        c = self.config
        if not (self.model.tie_embeddings and c.pp > 1 and (layout.embedding or layout.head)):
            return 0.0
        grad_bytes = self.model.vocab_size * self.model.hidden_size / c.tp * self.reduced_grad_bytes
        return comm.ring_allreduce_time_s(grad_bytes, 2, comm.pipeline_link(self.group(layout.node_group), c))

    def zero3_exposed_s(self, layout: StageLayout, ranks: int, link) -> float:
        """FSDP / ZeRO-3, every micro-batch: each unit (layer, embedding, head) all-gathers its weights (its
        routed experts over the expert data-parallel ranks, the rest over dp·cp) before its forward and again before its backward, and reduce-scatters its gradients after it —
        each a ring collective paying `(n−1)·α` of latency (NCCL has no tree for all-gather and
        reduce-scatter). Prefetching hides a unit's collectives behind the compute of its neighbour,
        so per unit only what exceeds one unit's forward (resp. backward) is exposed (FSDP2's
        implicit prefetch; Zhao et al. 2023, PyTorch FSDP, §3.3). An engine whose collectives run below the
        modelled speed, or hide behind less of the neighbour's compute, says so in its profile
        (`EngineProfile.zero3_comm_efficiency`, `zero3_overlap`); one that gathers tensor by tensor pays
        `per_tensor_gather_s` on each all-gather (DeepSpeed's ZeRO-3 as SC21 ran it).

        Under torch's pipelining (`reduces_after_last_backward`) every backward of a run leaves the weights gathered
        (`set_reshard_after_backward(False)`) and the gradients unreduced: a micro-batch gathers once (its
        forward finds the weights the last backward left, or its backward re-gathers what the forward freed),
        and each run reduce-scatters once, after the stage's last backward, exposed (`perform_reduce_grad`)."""
        e, g = self.training.element_bytes, layout.node_group
        engine = self.training.profile
        slowdown = 1 / engine.zero3_comm_efficiency
        overlap = engine.zero3_overlap
        prefetches_backward = engine.zero3_backward_prefetch

        def unit_exposed_s(gather: float, scatter: float, forward: float, backward: float) -> float:
            if prefetches_backward:
                backward_exposed = max(0.0, gather + scatter - overlap * backward)
            else:  # the all-gather waits for the gradients before it; the reduce-scatter hides behind the next unit
                backward_exposed = gather + max(0.0, scatter - overlap * backward)
            return max(0.0, gather - overlap * forward) + backward_exposed

        # a micro-batch's exposure with its reduce-scatters, without them (sync deferred), and with one prefetched
        # gather a unit (torch's pipelining); the reduce-scatters themselves, whole
        exposed = unreduced = gathered_once = scatters = 0.0
        expert_link = comm.expert_axis_link(self.group(g), self.config, "edp")
        for c in layout.layers:
            # a layer's routed experts gather over their own data-parallel ranks (edp: dp·cp/ep·… with ep),
            # the rest over dp·cp, one after the other (Megatron-FSDP's expt_dp group, torchtitan's edp mesh)
            parts = [(self.layer_params(c.kind) - self.layer_expert_params(c.kind), ranks, link),
                     (self.layer_expert_params(c.kind), self.config.edp, expert_link)]
            # the offload copies every shard, a one-rank group's (whole) too
            copies = sum(self.offload_copy_s(p / n, g) for p, n, _ in parts if p > 0)
            parts = [(p, n, lk) for p, n, lk in parts if p > 0 and n > 1]
            gather = sum(comm.allgather_time_s(p * e, n, lk) for p, n, lk in parts) * slowdown
            if engine.zero3_gathers_per_tensor:
                gather += self.per_tensor_gather_s(c.kind, ranks, link, engine)
            scatter = sum(comm.reduce_scatter_time_s(p * self.reduced_grad_bytes, n, lk) for p, n, lk in parts) * slowdown
            gather, scatter = gather + copies, scatter + copies
            forward, backward = self.zero3_windows_s(c.kind, c.recompute, g, [lk for _, _, lk in parts])
            exposed += c.count * unit_exposed_s(gather, scatter, forward, backward)
            unreduced += c.count * unit_exposed_s(gather, 0.0, forward, backward)
            gathered_once += c.count * max(0.0, gather - overlap * backward)
            scatters += c.count * scatter
        fixed = self.stage_fixed_params(empty_stage(layout.embedding, layout.head))
        if fixed:
            copy = self.offload_copy_s(fixed / ranks, g)
            fixed_gather = comm.allgather_time_s(fixed * e, ranks, link) * slowdown + copy
            fixed_scatter = comm.reduce_scatter_time_s(fixed * self.reduced_grad_bytes, ranks, link) * slowdown + copy
            exposed += 2 * fixed_gather + fixed_scatter
            unreduced += 2 * fixed_gather
            gathered_once += fixed_gather
            scatters += fixed_scatter
        if self.reduces_after_last_backward:
            return self.num_microbatches * gathered_once + self.config.schedule_runs * scatters
        if self.defers_grad_sync:  # the reduce-scatters behind the step's last micro-batch only
            return (self.num_microbatches - 1) * unreduced + exposed
        return self.num_microbatches * exposed

    def zero3_windows_s(self, kind: str, recompute: str, group: int, fsdp_links: list) -> tuple[float, float]:
        """How long one layer's forward, and its backward with the replay, run — the window its neighbour's
        gathers and reduce-scatters hide behind. Its compute always; its own tp collectives and token exchange
        too when they stay inside the scale-up domain while every FSDP collective of the layer leaves it: the
        gathers then ride the NICs while the exchange rides NVLink, and the prefetched gather, issued on its
        own stream before the layer starts, runs through all of the layer, not its GEMMs alone (Megatron-FSDP
        and FSDP2 issue the next unit's all-gather before the current unit's compute). The exchange's passes
        split as they run: one forward, the backward's and a replay's after it."""
        lt, g = self.layer_time(kind, group), self.group(group)
        forward, backward = lt.forward_s, lt.backward_s + self.layer_recompute_s(kind, recompute, group)
        if not fsdp_links or any(lk == g.intra_node for lk in fsdp_links):
            return forward, backward
        inside = []  # (seconds per layer, passes they run in)
        if self.config.tp > 1 and comm.axis_link(g, self.config, "tp") == g.intra_node:
            inside.append((self.layer_tp_comm_s(kind, recompute, group), self.tp_passes(recompute)))
        if self.kinds[kind].moe and comm.expert_axis_link(g, self.config, "ep") == g.intra_node:
            inside.append((self.layer_ep_comm_s(kind, recompute, group), self.ep_passes(recompute)))
        return (forward + sum(s / n for s, n in inside),
                backward + sum(s * (n - 1) / n for s, n in inside))

    def offload_copy_s(self, shard_params: float, group: int) -> float:
        """One unit's shard crossing the host link under FSDP's CPU offload — its parameters copied in before the
        all-gather, its reduced gradients out after the reduce-scatter, each in the collective's stream, in the
        dtype the shards are kept in (fp32; bf16 under `pure_bf16`); 0 without the offload."""
        if not self.training.fsdp_offload:
            return 0.0
        kept = memory.fsdp_kept_bytes(self.training.element_bytes, self.training.pure_bf16)
        return shard_params * kept / (self.host_bandwidths(group)[0] * 1e9)

    def host_bandwidths(self, group: int) -> tuple[float, float]:
        """(host link, host memory) GB/s of the group's device: what a step on the host runs at."""
        hardware = self.group(group).hardware
        if hardware.host_link_GBps is None or hardware.host_memory_GBps is None:
            raise InputError(f"{hardware.name} states no host link or host memory bandwidth, so an optimizer on the "
                             "host cannot be priced on it", hint="leave the offload out, or add host_link_GBps and "
                             "host_memory_GBps to the hardware file")
        return hardware.host_link_GBps, hardware.host_memory_GBps

    def per_tensor_gather_s(self, kind: str, ranks: int, link, engine) -> float:
        """What gathering a unit tensor by tensor adds to one collective of its bytes: every further call's ring
        latency `(n−1)·α`, and per call its host time and its n copy launches (`EngineProfile.zero3_gathers_per_tensor`)."""
        tensors = self.model.layer_param_tensors(self.kinds[kind])
        return ((tensors - 1) * (ranks - 1) * link.latency_s
                + tensors * (engine.zero3_gather_host_s + ranks * engine.zero3_copy_launch_s))

    def optimizer_s(self, stage: StagePrediction) -> float:
        t = self.training
        moved = compute.PURE_BF16_ADAM_BYTES_PER_PARAM if t.pure_bf16 else \
            compute.adam_bytes_moved_per_param(memory.adam_state_bytes(t), memory.keeps_master_remainders(t))
        local = self.optimizer_local_params(stage.params, stage.expert_params)
        if t.fsdp_offload:  # Adam on the host, over the shards it keeps there (the copies are the collectives')
            return local * moved / (self.host_bandwidths(stage.node_group)[1] * 1e9)
        on_device = compute.optimizer_time_s(self.device(stage.node_group), local * (1 - t.optimizer_offload), moved)
        if not t.optimizer_offload:
            return on_device
        return max(on_device, self.offloaded_optimizer_s(stage.node_group, local * t.optimizer_offload))

    def offloaded_optimizer_s(self, group: int, params: float) -> float:
        """The host's share of the step, beside the device's (Megatron's HybridDeviceOptimizer steps both at once):
        each offloaded parameter's main gradient copied to the host (`grad_bytes`) and its updated 16-bit weight
        back, each at the host link in its own direction, and Adam run by the host CPUs on fp32 states at the
        device's share of the host memory bandwidth (`compute.ADAM_BYTES_PER_PARAM` moved each); with
        `optimizer_offload_overlap` the three pipeline group by group (the slowest shows), else one after the
        other."""
        link_GBps, memory_GBps = self.host_bandwidths(group)
        to_host_s = params * self.training.grad_bytes / (link_GBps * 1e9)
        to_device_s = params * self.training.element_bytes / (link_GBps * 1e9)
        host_step_s = params * compute.ADAM_BYTES_PER_PARAM / (memory_GBps * 1e9)
        parts = (to_host_s, host_step_s, to_device_s)
        return max(parts) if self.training.optimizer_offload_overlap else sum(parts)

    def optimizer_local_params(self, params: float, expert_params: float = 0.0) -> float:
        """Parameters one device's optimizer updates: all of them, or with zero ≥ 1 its shard — over dp·cp,
        and the routed experts' over edp."""
        c = self.config
        if c.zero == 0:
            return params
        return (params - expert_params) / memory.zero_shard_ranks(c) + expert_params / c.edp

    # ---- the step -----------------------------------------------------------------------------------
    def predict(self, layouts: list[StageLayout] | None = None) -> Prediction:
        c = self.config
        layouts = layouts or uniform_layout(self.model, c.pp, c.recompute, c.vpp)
        stages = [self.stage(i, s) for i, s in enumerate(layouts)]
        times = [s.time_s for s in stages]
        m = self.num_microbatches
        critical = max(stages, key=lambda s: s.time_s)
        bubble = c.schedule_runs * pipeline.bubble_time_s(times, c.vpp)  # every run of the schedule fills and drains
        dp_s = max(self.dp_exposed_s(s, layout) for s, layout in zip(stages, layouts))
        optimizer_s = max(self.optimizer_s(s) for s in stages)
        overhead_s = max(self.group(s.node_group).hardware.efficiency.step_overhead_s for s in stages)
        breakdown = StepBreakdown(
            compute=m * (critical.forward_s + critical.backward_s), tp_comm=m * critical.tp_comm_s,
            cp_comm=m * critical.cp_comm_s, ep_comm=m * critical.ep_comm_s, pp_comm=m * critical.pp_comm_s, dp_comm=dp_s,
            bubble=bubble, optimizer=optimizer_s, overhead=overhead_s,
        )
        step_s = m * max(times) + bubble + dp_s + optimizer_s + overhead_s  # pipeline.pipeline_time_s, run by run
        return self._prediction(step_s, breakdown, stages)

    def devices_per_stage(self) -> int:
        return self.config.dp * self.config.tp * self.config.cp

    def _prediction(self, step_s: float, breakdown: StepBreakdown, stages: list[StagePrediction]) -> Prediction:
        flops = compute.model_flops_per_step(self.model, self.training)
        per_stage = self.devices_per_stage()
        # MFU against the base (BF16) peak for FP8 recipes: the published tables' convention
        peak = sum(per_stage * self.group(s.node_group).hardware.peak_flops(self.training.base_precision)
                   for s in stages)
        world = per_stage * len(stages)
        return Prediction(
            step_time_s=step_s,
            tokens_per_s=self.training.tokens_per_step / step_s,
            samples_per_s=self.training.gbs / step_s,
            model_tflops_per_device=flops / step_s / world / 1e12,
            mfu=flops / step_s / peak,
            memory_bytes_per_device_max=max(s.memory_bytes for s in stages),
            fits=all(s.memory_bytes <= s.memory_budget_bytes for s in stages),
            num_microbatches=self.num_microbatches,
            breakdown=breakdown,
            stages=stages,
        )


def predict(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, config: ParallelConfig,
            layouts: list[StageLayout] | None = None) -> Prediction:
    """Predict one configuration (uniform Megatron split unless `layouts` is given)."""
    return StepModel(model, training, cluster, config).predict(layouts)
