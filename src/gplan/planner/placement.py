"""Placement: a named rank grid, its process groups, and the devices every rank runs on.

Ranks form one grid with axes `pp, dp, cp, tp` (outermost first): rank = ((pp·D + dp)·C + cp)·T + tp,
the order of Megatron-core's RankGenerator for `tp-cp-dp-pp`. A group of an axis is a slice of the grid
along that axis with the other coordinates fixed — no global state. Devices are handed out node by
node, stage by stage, from each stage's node group, so tp groups (innermost, consecutive ranks) stay
inside a node when tp divides the devices per node, dp and cp groups take the next-fastest links, and
stage boundaries fall on the slowest links (node boundaries) — veGiantModel's topology-aware order.
A networkx graph of the cluster gives the link class and bandwidth each group actually rides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gplan.cost_models.communication import AXIS_ORDER
from gplan.errors import InputError
from gplan.plan import DeviceRange, DeviceRef, Placement
from gplan.profiles.schema import ClusterSpec
from gplan.spec.parallel import ParallelConfig

if TYPE_CHECKING:
    import networkx as nx


def rank_grid(config: ParallelConfig) -> np.ndarray:
    """ranks as an array of shape (pp, dp, cp, tp)."""
    shape = [getattr(config, axis) for axis in AXIS_ORDER]
    return np.arange(int(np.prod(shape))).reshape(shape)


def axis_groups(config: ParallelConfig, axis: str) -> list[list[int]]:
    """Every process group of `axis`: the grid's lines along that axis."""
    grid = rank_grid(config)
    moved = np.moveaxis(grid, AXIS_ORDER.index(axis), -1)
    return [list(map(int, line)) for line in moved.reshape(-1, moved.shape[-1])]


def place(cluster: ClusterSpec, config: ParallelConfig, stage_groups: list[int]) -> Placement:
    """Assign devices to ranks: stage i takes the next free devices of node group `stage_groups[i]`,
    node by node — one range per stage, whatever the world size."""
    used = [0] * len(cluster.node_groups)
    per_stage = config.dp * config.cp * config.tp
    ranges = []
    for stage, group in enumerate(stage_groups):
        left = cluster.node_groups[group].devices - used[group]
        if left < per_stage:
            raise InputError(
                f"stage {stage} needs {per_stage} devices of node group {group}, {left} left",
                hint="use fewer devices per stage or add nodes to that group",
            )
        ranges.append(DeviceRange(node_group=group, first=used[group], count=per_stage))
        used[group] += per_stage
    return Placement(axis_order=list(AXIS_ORDER), mesh_shape=[getattr(config, a) for a in AXIS_ORDER],
                     stage_devices=ranges)


# ---- topology -----------------------------------------------------------------------------------

def topology(cluster: ClusterSpec) -> "nx.Graph":
    """Devices as `(node, local)` vertices; an edge per device pair in a node (intra-node link); the
    devices of a scale-up domain larger than a node (an NVL72 rack) also meet at its switch (intra-node
    link); each device reaches the fabric (inter-node link). Edges cost 1/bandwidth, so a path takes the
    fastest links."""
    import networkx as nx  # only `explain` and `validate` walk the graph; search stays quick to start

    graph = nx.Graph()
    node = 0

    def link(a, b, kind: str, bandwidth: float) -> None:
        graph.add_edge(a, b, link=kind, bandwidth_GBps=bandwidth, cost=1.0 / bandwidth)

    for g, group in enumerate(cluster.node_groups):
        for n in range(group.nodes):
            devices = [(node, i) for i in range(group.devices_per_node)]
            graph.add_nodes_from(devices, kind="device")
            for a in range(len(devices)):
                for b in range(a + 1, len(devices)):
                    link(devices[a], devices[b], "intra", group.intra_node.bandwidth_GBps)
            for d in devices:
                link(d, "fabric", "inter", group.inter_node.bandwidth_GBps)
                if group.nodes_per_domain > 1:
                    link(d, ("domain", g, n // group.nodes_per_domain), "intra", group.intra_node.bandwidth_GBps)
            node += 1
    return graph


def group_link(graph: "nx.Graph", devices: list[DeviceRef]) -> tuple[str, float]:
    """The slowest link on the ring through `devices` (in order): its class and GB/s per device."""
    if len(devices) < 2:
        return "none", float("inf")
    ring = [(d.node, d.local) for d in devices]
    worst = ("intra", float("inf"))
    for a, b in zip(ring, ring[1:] + ring[:1]):
        if a == b:
            continue
        path = _shortest_path(graph, a, b)
        for u, v in zip(path, path[1:]):
            edge = graph.edges[u, v]
            if edge["bandwidth_GBps"] < worst[1]:
                worst = (edge["link"], edge["bandwidth_GBps"])
    return worst


def _shortest_path(graph: "nx.Graph", a, b) -> list:
    import networkx as nx

    return nx.shortest_path(graph, a, b, weight="cost")
