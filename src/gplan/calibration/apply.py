"""The one way fitted parameters reach a cluster (or a profile, which is a cluster with provenance).

θ is a mapping; each key is one of
    compute_scale          scales the GEMM, attention and element-wise efficiencies (capped at 1) and
                           divides the GEMM size at which efficiency halves
    link_efficiency_scale  scales every link class's efficiency (capped at 1)
    link_latency_scale     scales every link class's latency
    <Efficiency field>     sets that field (gemm, gemm_half_gflop, attention, memory, layer_overhead_s,
                           step_overhead_s)
    intra_node, inter_node a mapping of LinkSpec fields to set (a measured link)
    engine_factor:<engine> sets that engine's factor on the compute efficiencies (DeviceSpec.engine_efficiency:
                           runs of several engines on one cluster, each at its own speed)
and applies to every node group.
"""

from __future__ import annotations

from typing import Any, TypeVar

from gplan.profiles.schema import ClusterSpec, Efficiency, NodeGroup

C = TypeVar("C", bound=ClusterSpec)
LINKS = ("intra_node", "inter_node")
ENGINE_FACTOR = "engine_factor:"


def apply(cluster: C, theta: dict[str, Any]) -> C:
    unknown = {k for k in theta if not k.startswith(ENGINE_FACTOR)} - {
        "compute_scale", "link_efficiency_scale", "link_latency_scale", *LINKS, *Efficiency.model_fields}
    if unknown:
        raise ValueError(f"unknown calibration parameters: {sorted(unknown)}")
    return cluster.model_copy(update={"node_groups": [_group(g, theta) for g in cluster.node_groups]})


def _group(group: NodeGroup, theta: dict[str, Any]) -> NodeGroup:
    eff = group.hardware.efficiency
    update: dict[str, Any] = {}
    if "compute_scale" in theta:
        c = theta["compute_scale"]
        update.update(gemm=min(1.0, eff.gemm * c), attention=min(1.0, eff.attention * c),
                      memory=min(1.0, eff.memory * c), gemm_half_gflop=eff.gemm_half_gflop / c)
    update.update({k: v for k, v in theta.items() if k in Efficiency.model_fields})
    engines = {**group.hardware.engine_efficiency,
               **{k[len(ENGINE_FACTOR):]: v for k, v in theta.items() if k.startswith(ENGINE_FACTOR)}}
    hardware = group.hardware.model_copy(update={"efficiency": eff.model_copy(update=update),
                                                 "engine_efficiency": engines})
    links = {}
    for name in LINKS:
        link = getattr(group, name)
        change = dict(theta.get(name, {}))
        if "link_efficiency_scale" in theta:
            change.setdefault("efficiency", min(1.0, link.efficiency * theta["link_efficiency_scale"]))
        if "link_latency_scale" in theta:
            change.setdefault("latency_us", link.latency_us * theta["link_latency_scale"])
        links[name] = link.model_copy(update=change)
    return group.model_copy(update={"hardware": hardware, **links})
