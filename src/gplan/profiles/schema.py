"""The cluster a plan runs on: devices, node groups and links.

A ClusterSpec is self-contained once loaded: hardware names are resolved against the bundled catalogue
into full DeviceSpecs, so a plan file carries every number its prediction used.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 1024**3


class Efficiency(BaseModel):
    """Fractions of peak that real kernels reach; calibrated per hardware kind (bench/accuracy.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm: float = Field(gt=0, le=1)
    """Fraction of dense peak that a large GEMM sustains."""
    gemm_half_gflop: float = Field(default=1.0, ge=0)
    """GEMM size (GFLOP per call) at which efficiency falls to half of `gemm`: small and tp-sharded
    matrices run further from peak."""
    attention: float = Field(gt=0, le=1)
    """Fraction of dense peak that fused (flash) attention sustains."""
    memory: float = Field(default=0.8, gt=0, le=1)
    """Fraction of HBM bandwidth that element-wise kernels (norms, activations, Adam) sustain."""
    layer_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed time per layer per micro-batch forward (backward: twice) for kernel launches and
    framework hooks; dominates small layers."""
    step_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed per-step time outside the model (launch, logging, data loading)."""


class LayerMeasurement(BaseModel):
    """A measured part of the model (`gplan profile`), as one tp rank computes it: the layer with its
    heads and MLP width divided by `tp`, the head with its vocabulary divided by `tp`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    part: Literal["layer", "head", "embedding"]
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_kind: str
    vocab_size: int
    seq_length: int
    mbs: int
    tp: int
    precision: str
    status: Literal["ok", "oom", "error"] = "ok"
    forward_s: float | None = None
    backward_s: float | None = None
    """Backward without recomputation."""
    attention_forward_s: float | None = None
    """The attention core alone (what selective recomputation replays); layers only."""
    backward_full_recompute_s: float | None = None
    """Backward with full recomputation (forward replayed), measured to check the model's sum."""
    activation_bytes: float | None = None
    """Bytes the forward saves for the backward (saved-tensor hooks), per micro-batch."""
    note: str | None = None
    """Why a measurement was rejected (status error): an impossible time, an outlier."""

    def shape_key(self) -> tuple:
        return (self.part, self.hidden_size, self.ffn_hidden_size, self.num_attention_heads, self.num_kv_heads,
                self.ffn_kind, self.vocab_size, self.seq_length, self.tp, self.precision)


class DeviceSpec(BaseModel):
    """One accelerator kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["gpu", "npu", "cpu"]
    memory_GiB: float = Field(gt=0)
    peak_tflops: dict[str, float]
    """Dense peak per precision (bf16, fp16, fp32); a missing precision is unsupported."""
    hbm_bandwidth_GBps: float = Field(gt=0)
    host_link_GBps: float | None = Field(default=None, gt=0)
    """Device-to-host bandwidth in each direction (PCIe, or NVLink-C2C on Grace superchips): what activation
    offloading moves at. None: not stated, and offloading is not priced on it."""
    host_memory_GBps: float | None = Field(default=None, gt=0)
    """One device's share of its host's memory bandwidth (the node's CPU sockets' DRAM channels over its devices):
    what an optimizer stepped on the host moves at. None: not stated, and host offloading of the optimizer is not
    priced on it."""
    reserve_GiB: float = Field(default=0.0, ge=0)
    """Memory held before the model: the CUDA (or CANN) context and library workspaces. (Plans written
    before the next two fields existed folded communicators and fragmentation in here.)"""
    communicator_MiB: float = Field(default=0.0, ge=0)
    """Device memory of one NCCL/HCCL communicator (its channels' buffers); each group a device
    communicates in holds one."""
    fragmentation: float = Field(default=0.0, ge=0, lt=1)
    """Memory the caching allocator reserves beyond what is allocated, as a fraction of the allocated."""
    efficiency: Efficiency
    precision_efficiency: dict[str, float] = {}
    """Precision -> factor on the GEMM efficiency of GEMMs run at that precision (FP8 with its scaling
    and casts reaches a different fraction of its peak than BF16 of its own)."""
    engine_efficiency: dict[str, float] = {}
    """Engine -> factor on the compute efficiencies (GEMM, attention, element-wise) of runs that engine
    trains: the same layout runs at different speeds in Megatron-LM, Megatron-DeepSpeed and FSDP stacks.
    An engine not listed runs at `efficiency` (fitted on Megatron-LM's runs)."""
    engine_precision_efficiency: dict[str, dict[str, float]] = {}
    """Engine -> precision -> factor replacing `precision_efficiency` for that engine's low-precision
    GEMMs (torchao's float8 kernels in gplan's torch worker and torchtitan are not Transformer Engine's)."""
    fa2_attention_ratio: float = Field(default=1.0, gt=0, le=1)
    """Speed of a FlashAttention-2-class kernel (flash-attn 2, torch SDPA's flash backend, Triton's) over the
    fused kernel `efficiency.attention` was fitted on: 1 where that kernel is FlashAttention-2 itself (A100);
    below 1 where the device has a newer one that FlashAttention-2 cannot use (Hopper's cuDNN and
    FlashAttention-3 kernels, on its asynchronous tensor cores). An engine names its kernel
    (`EngineProfile.attention_kernel`)."""
    torch_grouped_mm_ratio: float = Field(default=1.0, gt=0, le=1)
    """Speed of torch's BF16 grouped GEMM (`torch._grouped_mm`, its CUTLASS kernels), forward and backward together,
    over the routed experts' GEMMs as priced (`cost_models.experts.routed_time_s`, one expert's shape at `efficiency`):
    measured in kernel benchmarks (bench/grouped_mm.py). An engine that runs its experts on it says so
    (`EngineProfile.expert_kernel`: torchtitan); 1 where no benchmark was published."""
    torch_grouped_mm_forward_ratio: float = Field(default=1.0, gt=0, le=1)
    """The same kernel's forward alone (its backward's speed follows from the two: `experts.kernel_ratios`)."""

    #: Fields added after schema v1 plans were first written, left out of the digest at their default.
    DIGEST_OPTIONAL: ClassVar[dict[str, object]] = {"communicator_MiB": 0.0, "fragmentation": 0.0, "host_link_GBps": None,
                                                    "host_memory_GBps": None,
                                                    "engine_efficiency": {}, "precision_efficiency": {},
                                                    "engine_precision_efficiency": {}, "fa2_attention_ratio": 1.0,
                                                    "torch_grouped_mm_ratio": 1.0, "torch_grouped_mm_forward_ratio": 1.0}

    @model_validator(mode="after")
    def _grouped_mm_backward_is_slower_than_nothing(self) -> "DeviceSpec":
        # the backward's speed is what the forward leaves of the three products' time: there must be some left
        if 3 / self.torch_grouped_mm_ratio <= 1 / self.torch_grouped_mm_forward_ratio:
            raise ValueError(f"torch_grouped_mm_forward_ratio {self.torch_grouped_mm_forward_ratio} leaves no time for "
                             f"the backward in torch_grouped_mm_ratio {self.torch_grouped_mm_ratio} (the forward and "
                             "backward together): it must exceed a third of it")
        return self

    def for_engine(self, engine: str | None, attention_kernel: str = "fused") -> "DeviceSpec":
        """This device as `engine` runs it: its compute efficiencies scaled by the engine's factor
        (capped at 1), the GEMM size at which efficiency halves divided by it; its fused attention at
        `fa2_attention_ratio` where the engine's kernel is FlashAttention-2's class (`attention_kernel` "fa2")."""
        factor = self.engine_efficiency.get(engine or "", 1.0)
        attention = self.fa2_attention_ratio if attention_kernel == "fa2" else 1.0
        precision = self.engine_precision_efficiency.get(engine or "", {})
        device = self.model_copy(update={"precision_efficiency": {**self.precision_efficiency, **precision}}) \
            if precision else self
        if factor == 1.0 and attention == 1.0:
            return device
        e = self.efficiency
        scaled = e.model_copy(update={"gemm": min(1.0, e.gemm * factor),
                                      "attention": min(1.0, e.attention * factor * attention),
                                      "memory": min(1.0, e.memory * factor), "gemm_half_gflop": e.gemm_half_gflop / factor})
        return device.model_copy(update={"efficiency": scaled})

    measured: list[LayerMeasurement] = []
    """Measured layer times (`gplan profile`); the cost model uses them where a shape matches."""

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * GIB

    def peak_flops(self, precision: str) -> float:
        """Dense peak of the tensor cores a precision runs on (fp8-rowwise on the fp8 ones)."""
        from gplan.spec.training import tensor_core_format

        return self.peak_tflops[tensor_core_format(precision)] * 1e12

    def supports(self, precision: str) -> bool:
        from gplan.spec.training import tensor_core_format

        return tensor_core_format(precision) in self.peak_tflops


class LinkSpec(BaseModel):
    """A link class: bandwidth per device per direction, and latency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandwidth_GBps: float = Field(gt=0)
    """GB/s (1e9 bytes) per device per direction."""
    latency_us: float = Field(default=5.0, ge=0)
    efficiency: float = Field(default=0.8, gt=0, le=1)
    """Fraction of the bandwidth that collectives reach (NCCL/HCCL bus bandwidth / link bandwidth)."""

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_GBps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class NodeGroup(BaseModel):
    """Identical nodes: the same device kind, count per node and links."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hardware: DeviceSpec
    """The device description; a cluster file may name a bundled one, which `catalogue.load_cluster`
    resolves before validation (a schema never reads package data)."""
    nodes: int = Field(default=1, gt=0)
    devices_per_node: int = Field(gt=0)
    """Devices of one host (one torchrun per node)."""
    nodes_per_domain: int = Field(default=1, gt=0)
    """Nodes sharing one scale-up domain whose links are `intra_node`: 1 for a DGX (NVLink inside the
    box), 18 for an NVL72 rack (18 trays of 4 GPUs on one NVLink Switch System)."""
    intra_node: LinkSpec
    """The scale-up link (NVLink, HCCS) between devices of one domain."""
    inter_node: LinkSpec
    """The scale-out link (InfiniBand, RoCE) between domains."""

    #: Fields added after schema v1 plans were first written, left out of the digest at their default.
    DIGEST_OPTIONAL: ClassVar[dict[str, object]] = {"nodes_per_domain": 1}

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def domain_devices(self) -> int:
        """Devices of one scale-up domain (never more than the group has)."""
        return min(self.devices, self.devices_per_node * self.nodes_per_domain)


MAX_DEVICES = 2**20
"""The largest cluster gplan plans for (1,048,576 devices, several times the largest of 2026): a
cluster file beyond it is a typo, refused at once instead of searched for hours."""


class ClusterSpec(BaseModel):
    """Node groups; several groups make a heterogeneous cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    node_groups: list[NodeGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _not_absurd(self) -> "ClusterSpec":
        if self.devices > MAX_DEVICES:
            raise ValueError(f"{self.devices:,} devices: gplan plans clusters of up to {MAX_DEVICES:,} "
                             "(check nodes and devices_per_node)")
        return self

    @property
    def devices(self) -> int:
        return sum(g.devices for g in self.node_groups)

    @property
    def is_heterogeneous(self) -> bool:
        return len({g.hardware.name for g in self.node_groups}) > 1

    @property
    def primary(self) -> NodeGroup:
        return self.node_groups[0]

    @property
    def smallest_domain_devices(self) -> int:
        """Devices of the smallest scale-up domain over the node groups (what a job-wide switch must fit)."""
        return min(g.domain_devices for g in self.node_groups)

    def sized(self, devices: int) -> "ClusterSpec":
        """A single-group template resized to hold `devices` (bundled clusters are node templates)."""
        if len(self.node_groups) != 1:
            return self
        group = self.primary
        nodes = max(1, math.ceil(devices / group.devices_per_node))
        per_node = min(group.devices_per_node, devices) if nodes == 1 else group.devices_per_node
        return self.model_copy(update={"node_groups": [group.model_copy(
            update={"nodes": nodes, "devices_per_node": per_node})]})


# ---- measured profiles -----------------------------------------------------------------------------

class LinkMeasurement(BaseModel):
    """One collective at one message size: the slowest rank's median time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Literal["allreduce", "allgather", "reduce_scatter", "sendrecv"]
    scope: Literal["intra", "inter"]
    ranks: int
    size_bytes: int
    time_s: float


class LinkFit(BaseModel):
    """α (latency per ring step) and β (bandwidth) fitted to one collective's measurements."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: str
    scope: Literal["intra", "inter"]
    latency_us: float
    bandwidth_GBps: float


class ProfileProvenance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    devices: int
    device_name: str
    framework: str
    framework_version: str
    gplan_version: str
    created_at: str
    command: str = ""


class Profile(BaseModel):
    """A measured cluster: the catalogue's cluster schema (node groups whose hardware carries fitted
    efficiencies and measured layers, links with fitted α/β), plus the raw link measurements, how
    they were taken, and — after `gplan calibrate` — the fit to measured runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    node_groups: list[NodeGroup] = Field(min_length=1)
    provenance: ProfileProvenance
    links: list[LinkMeasurement] = []
    link_fits: list[LinkFit] = []
    calibration: dict[str, Any] | None = None

    def cluster(self) -> ClusterSpec:
        return ClusterSpec(name=self.name, node_groups=self.node_groups)
