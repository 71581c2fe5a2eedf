"""Communication: alpha–beta times of collectives and point-to-point sends (docs/design.md, "Cost model").

A group inside one scale-up domain (a node; a whole rack on an NVL72) runs at the intra-node bandwidth. A group that spans nodes is bounded by the
NICs: with k members per node, NCCL/HCCL run k rings (one per NIC) that each carry 1/k of the data,
so the group sees `min(intra, k × inter)` per device — an FSDP group over whole 8-GPU nodes is eight
times faster than a dp group of one GPU per node (the placement effect veGiantModel reports). Rank layout:
axes `pp, dp, cp, tp` from outermost to innermost (Megatron's tp-cp-dp-pp order), so an axis' group
spans `stride × size` consecutive ranks, stride = product of the inner degrees.
"""

from __future__ import annotations

from gplan.profiles.schema import LinkSpec, NodeGroup
from gplan.spec.parallel import ParallelConfig

#: Mesh axes from outermost to innermost.
AXIS_ORDER: tuple[str, ...] = ("pp", "dp", "cp", "tp")


def ring_allreduce_time_s(size_bytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-reduce of S bytes over n devices: `2·(n−1)/n · S/B + 2·(n−1)·α` (Thakur et al. 2005)."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * size_bytes / link.bytes_per_s + 2 * (n - 1) * link.latency_s


def allgather_time_s(size_bytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-gather (or reduce-scatter) of an S-byte result: `(n−1)/n · S/B + (n−1)·α`."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return (n - 1) / n * size_bytes / link.bytes_per_s + (n - 1) * link.latency_s


reduce_scatter_time_s = allgather_time_s


def p2p_time_s(size_bytes: float, link: LinkSpec) -> float:
    """One send: `S/B + α`."""
    return size_bytes / link.bytes_per_s + link.latency_s


def _degrees(config: ParallelConfig) -> dict[str, int]:
    return {axis: getattr(config, axis) for axis in AXIS_ORDER}


def axis_span(config: ParallelConfig, axis: str) -> int:
    """Consecutive ranks one group of `axis` covers: its stride × its size."""
    degrees = _degrees(config)
    inner = AXIS_ORDER[AXIS_ORDER.index(axis) + 1:]
    stride = 1
    for name in inner:
        stride *= degrees[name]
    return stride * degrees[axis]


def axis_stride(config: ParallelConfig, axis: str) -> int:
    return axis_span(config, axis) // _degrees(config)[axis]


def members_per_node(config: ParallelConfig, axis: str, devices_per_node: int) -> int:
    """How many devices of one `axis` group share a node — or a scale-up domain, when passed its size
    (1 when the stride is that or more)."""
    stride = axis_stride(config, axis)
    size = axis_span(config, axis) // stride
    return max(1, min(size, devices_per_node // stride))


def axis_link(group: NodeGroup, config: ParallelConfig, axis: str) -> LinkSpec:
    """The link class that bounds a group of `axis` (see the module docstring). "Inside" is the scale-up
    domain — a node of a DGX, the whole 72-GPU rack of an NVL72 — whose links are `intra_node`."""
    domain = group.domain_devices
    if axis_span(config, axis) <= domain:
        return group.intra_node
    k = members_per_node(config, axis, domain)
    inter = group.inter_node
    if k == 1:
        return inter
    bandwidth = min(group.intra_node.bandwidth_GBps, k * inter.bandwidth_GBps)
    return inter.model_copy(update={"bandwidth_GBps": bandwidth})


def pipeline_link(group: NodeGroup, config: ParallelConfig) -> LinkSpec:
    """Stage boundaries cross scale-up domains as soon as the whole pipeline does not fit in one; each
    device sends its own slice through its own NIC."""
    return group.intra_node if axis_span(config, "pp") <= group.domain_devices else group.inter_node


# ---- the expert side (MoE parallel folding) ----------------------------------------------------------
# A stage's dp·tp·cp ranks are regrouped as etp × ep × edp, etp innermost (Megatron-core's expert
# RankGenerator order tp-ep-dp): an ep group covers etp·ep consecutive ranks at stride etp, an edp group
# the whole stage block at stride etp·ep. Stage blocks are contiguous (pp outermost).

def expert_group(config: ParallelConfig, axis: str) -> tuple[int, int]:
    """(size, stride) of one group of the expert grid's `axis` ("etp", "ep" or "edp")."""
    c = config
    return {"etp": (c.etp, 1), "ep": (c.ep, c.etp), "edp": (c.edp, c.etp * c.ep)}[axis]


def expert_members_per_domain(config: ParallelConfig, axis: str, domain_devices: int) -> int:
    """Members of one expert-grid group inside one scale-up domain."""
    size, stride = expert_group(config, axis)
    return max(1, min(size, domain_devices // stride))


def expert_axis_link(group: NodeGroup, config: ParallelConfig, axis: str) -> LinkSpec:
    """The link class bounding a collective over an expert-grid group, as `axis_link` for the attention
    side's axes."""
    size, stride = expert_group(config, axis)
    domain = group.domain_devices
    if size * stride <= domain:
        return group.intra_node
    k = expert_members_per_domain(config, axis, domain)
    if k == 1:
        return group.inter_node
    bandwidth = min(group.intra_node.bandwidth_GBps, k * group.inter_node.bandwidth_GBps)
    return group.inter_node.model_copy(update={"bandwidth_GBps": bandwidth})


def alltoall_time_s(size_bytes: float, n: int, members_inside: int, intra: LinkSpec, inter: LinkSpec,
                    outside_share: float = 1.0) -> float:
    """All-to-all of the S bytes each of n devices sends, 1/n of it to each member (itself included):
    the `m − 1` members inside its scale-up domain over its intra-domain links and the `n − m` outside
    through its own NIC, both at once, so the slower part bounds it — `max((m−1)/n · S/B_intra,
    (n−m)/n · S/B_inter)` — plus one latency of the link it crosses (the n − 1 sends are posted together,
    NCCL's grouped send/recv). Balanced; an imbalance scales S. `outside_share` scales what leaves the
    domain (DeepEP sends a token once per destination domain: experts.deepep_outside_share)."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    m = min(members_inside, n)
    inside = (m - 1) / n * size_bytes / intra.bytes_per_s
    outside = (n - m) / n * size_bytes * outside_share / inter.bytes_per_s
    return max(inside, outside) + (inter.latency_s if n > m else intra.latency_s)
