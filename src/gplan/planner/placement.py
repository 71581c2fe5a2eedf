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



# ---- link classes from the rank grid (no graph walk) --------------------------------------------

def axis_link_classes(cluster: ClusterSpec, placement: Placement, config: ParallelConfig) -> dict[str, tuple[str, float]]:
    """For every axis of degree > 1: `inter` if any of its groups' ring hops crosses the fabric (else
    `intra`), and the GB/s of the slowest link any hop takes — the routes `group_link` finds on the
    cluster's graph (checked hop by hop against it on random clusters), but from the rank grid in
    O(world size) numpy instead of one shortest path per ring hop (a 16,384-rank plan has 10^5 hops:
    minutes of networkx). Tested against the graph on random clusters."""
    group_of, node_of, domain_of = device_coordinates(cluster, placement)
    shape = [getattr(config, axis) for axis in AXIS_ORDER]
    intra = np.array([g.intra_node.bandwidth_GBps for g in cluster.node_groups], dtype=float)
    inter = np.array([g.inter_node.bandwidth_GBps for g in cluster.node_groups], dtype=float)
    found = {}
    for axis in AXIS_ORDER:
        if getattr(config, axis) < 2:
            continue
        ring = [np.moveaxis(a.reshape(shape), AXIS_ORDER.index(axis), -1) for a in (group_of, node_of, domain_of)]
        following = [np.roll(a, -1, axis=-1) for a in ring]  # each rank to the next; the last to the first
        is_intra, bandwidth = hop_links(intra, inter, *ring, *following)
        found[axis] = ("intra" if is_intra.all() else "inter", float(bandwidth.min()))
    return found


def hop_links(intra, inter, group_a, node_a, domain_a, group_b, node_b, domain_b):
    """Whether the hop from device a to device b rides intra-node links, and the GB/s of its slowest
    link, taking the route `topology`'s graph does (the least sum of 1/bandwidth):
      - same node: the direct NVLink edge (cost 1/intra) or out and back through the fabric (2/inter);
      - same scale-up domain, another node: through the domain's switch (2/intra) or the fabric (2/inter);
      - otherwise: through the fabric (1/inter_a + 1/inter_b), as slow as the slower of the two.
    Ties go to the intra-node route."""
    same_node = node_a == node_b
    same_domain = ~same_node & (group_a == group_b) & (domain_a == domain_b)
    intra_cost = np.where(same_node, 1 / intra[group_a], np.where(same_domain, 2 / intra[group_a], np.inf))
    fabric_cost = 1 / inter[group_a] + 1 / inter[group_b]
    is_intra = intra_cost <= fabric_cost
    return is_intra, np.where(is_intra, intra[group_a], np.minimum(inter[group_a], inter[group_b]))


def device_coordinates(cluster: ClusterSpec, placement: Placement) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank, in rank order: its device's node group, node (cluster-wide) and scale-up domain (numbered
    within the group; a domain of one node is the node itself)."""
    groups, nodes, domains = [], [], []
    first_node = np.cumsum([0] + [g.nodes for g in cluster.node_groups])
    for r in placement.stage_devices:
        g = cluster.node_groups[r.node_group]
        node_in_group = (r.first + np.arange(r.count)) // g.devices_per_node
        groups.append(np.full(r.count, r.node_group))
        nodes.append(first_node[r.node_group] + node_in_group)
        domains.append(node_in_group // g.nodes_per_domain)
    return np.concatenate(groups), np.concatenate(nodes), np.concatenate(domains)
