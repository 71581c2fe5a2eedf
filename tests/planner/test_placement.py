"""Placement: the rank grid follows Megatron-core's `tp-cp-ep-dp-pp` order, and devices are handed
out so that tp stays inside a node and stage boundaries fall between nodes."""

from __future__ import annotations

import itertools

import pytest

from gplan.plan import placement_devices

from gplan.planner.placement import axis_groups, group_link, place, rank_grid, topology
from gplan.profiles.catalogue import load_cluster
from gplan.spec.parallel import ParallelConfig


def megatron_groups(sizes: dict[str, int], axis: str) -> list[list[int]]:
    """Megatron-core's rank groups for order tp-cp-ep-dp-pp (tp varies fastest), written independently:
    a rank's coordinates come from mixed-radix digits; a group holds the ranks that agree on all
    other coordinates."""
    order = ["tp", "cp", "dp", "pp"]
    world = 1
    for name in order:
        world *= sizes[name]
    groups: dict[tuple, list[int]] = {}
    for rank in range(world):
        rest, coords = rank, {}
        for name in order:
            rest, coords[name] = divmod(rest, sizes[name])
        key = tuple(coords[name] for name in order if name != axis)
        groups.setdefault(key, []).append(rank)
    return sorted(groups.values())


def test_golden_groups_for_tp2_dp2_pp2():
    config = ParallelConfig(dp=2, tp=2, pp=2)
    assert axis_groups(config, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(axis_groups(config, "dp")) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert sorted(axis_groups(config, "pp")) == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("tp, cp, dp, pp", [(2, 2, 2, 2), (8, 1, 4, 2), (4, 2, 1, 4), (1, 1, 8, 1), (2, 1, 3, 5)])
def test_groups_match_megatron_order(tp, cp, dp, pp):
    config = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp)
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    for axis in ("tp", "cp", "dp", "pp"):
        assert sorted(axis_groups(config, axis)) == megatron_groups(sizes, axis)
    assert rank_grid(config).shape == (pp, dp, cp, tp)


def test_tp_stays_in_a_node_and_stages_cross_nodes():
    cluster = load_cluster("dgx-a100-80g", 64)
    config = ParallelConfig(dp=2, tp=8, pp=4)
    placement = place(cluster, config, [0] * 4)
    devices = placement_devices(cluster, placement)
    assert len({(d.node, d.local) for d in devices}) == 64
    graph = topology(cluster)
    for group in axis_groups(config, "tp"):
        assert len({devices[r].node for r in group}) == 1
        assert group_link(graph, [devices[r] for r in group])[0] == "intra"
    for group in axis_groups(config, "pp"):
        nodes = [devices[r].node for r in group]
        assert len(set(nodes)) == len(nodes)
        assert group_link(graph, [devices[r] for r in group])[0] == "inter"


def test_dp_rides_the_fast_link_when_it_fits_in_a_node():
    cluster = load_cluster("dgx-a100-80g", 16)
    config = ParallelConfig(dp=4, tp=2, pp=2)
    devices = placement_devices(cluster, place(cluster, config, [0, 0]))
    graph = topology(cluster)
    for group in axis_groups(config, "dp"):
        assert group_link(graph, [devices[r] for r in group])[0] == "intra"


def test_heterogeneous_stages_take_devices_of_their_group(tmp_path):
    from gplan.profiles.catalogue import load_cluster as load

    path = tmp_path / "mixed.yaml"
    path.write_text(
        "name: mixed\nnode_groups:\n"
        "  - {hardware: a100-80g, nodes: 1, devices_per_node: 8, intra_node: {bandwidth_GBps: 300}, inter_node: {bandwidth_GBps: 25}}\n"
        "  - {hardware: v100-32g, nodes: 1, devices_per_node: 8, intra_node: {bandwidth_GBps: 150}, inter_node: {bandwidth_GBps: 12.5}}\n")
    cluster = load(str(path))
    config = ParallelConfig(dp=2, tp=4, pp=2)
    devices = placement_devices(cluster, place(cluster, config, [1, 0]))
    for stage, group in enumerate([1, 0]):
        ranks = [int(r) for r in itertools.chain.from_iterable(rank_grid(config)[stage].reshape(-1, 1))]
        assert {devices[r].node_group for r in ranks} == {group}


def _random_cluster(rng):
    """One or two node groups with distinct, random bandwidths (ties would let the graph pick either
    route), some with scale-up domains spanning several nodes."""
    from gplan.profiles.catalogue import hardware_entry
    from gplan.profiles.schema import ClusterSpec, DeviceSpec

    def bw():
        return float(rng.choice([25, 50, 100, 200, 300, 450, 900, 1800])) + rng.random()

    groups = []
    for _ in range(rng.integers(1, 3)):
        per_node = int(rng.choice([1, 2, 4, 8]))
        groups.append({"hardware": DeviceSpec.model_validate(hardware_entry("h100-sxm")), "nodes": int(rng.integers(1, 7)),
                       "devices_per_node": per_node, "nodes_per_domain": int(rng.choice([1, 1, 2, 3])),
                       "intra_node": {"bandwidth_GBps": bw()}, "inter_node": {"bandwidth_GBps": bw()}})
    return ClusterSpec.model_validate({"name": "random", "node_groups": groups})


def test_link_classes_from_the_grid_match_the_graph_hop_by_hop():
    """Every ring hop of every axis group, priced from the rank grid, takes the route (class and slowest
    GB/s) that networkx's shortest path finds on the cluster's graph — on random clusters and layouts."""
    import numpy as np

    from gplan.planner.placement import _shortest_path, axis_link_classes, device_coordinates, hop_links

    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(60):
        cluster = _random_cluster(rng)
        graph = topology(cluster)
        sizes = {1, 2, 3, 4}
        tp, cp, dp = (int(rng.choice(sorted(sizes))) for _ in range(3))
        per_stage = tp * cp * dp
        stage_groups = [g for g, group in enumerate(cluster.node_groups) for _ in range(group.devices // per_stage)]
        if not stage_groups:
            continue
        pp = int(rng.integers(1, len(stage_groups) + 1))
        config = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp)
        placement = place(cluster, config, stage_groups[:pp])
        devices = placement_devices(cluster, placement)
        group_of, node_of, domain_of = device_coordinates(cluster, placement)
        intra = np.array([g.intra_node.bandwidth_GBps for g in cluster.node_groups])
        inter = np.array([g.inter_node.bandwidth_GBps for g in cluster.node_groups])
        expected = {}
        for axis in ("pp", "dp", "cp", "tp"):
            if getattr(config, axis) < 2:
                continue
            worst, crosses = float("inf"), False
            for group in axis_groups(config, axis):
                for a, b in zip(group, group[1:] + group[:1]):
                    path = _shortest_path(graph, (devices[a].node, devices[a].local), (devices[b].node, devices[b].local))
                    edges = [graph.edges[u, v] for u, v in zip(path, path[1:])]
                    slowest = min(edges, key=lambda e: e["bandwidth_GBps"])
                    is_intra, bandwidth = hop_links(intra, inter, group_of[[a]], node_of[[a]], domain_of[[a]],
                                                    group_of[[b]], node_of[[b]], domain_of[[b]])
                    assert bool(is_intra[0]) == all(e["link"] == "intra" for e in edges)
                    assert bandwidth[0] == pytest.approx(slowest["bandwidth_GBps"])
                    worst = min(worst, slowest["bandwidth_GBps"])
                    crosses |= any(e["link"] == "inter" for e in edges)
                    checked += 1
            expected[axis] = ("inter" if crosses else "intra", pytest.approx(worst))
        assert axis_link_classes(cluster, placement, config) == expected
    assert checked > 500


def test_link_classes_of_a_16384_rank_plan_come_from_the_grid():
    """Llama 3 405B's layout on 16,384 H100s (tp 8 in a node, cp 2, pp 16, dp 64): tp on NVLink, the
    other axes across the fabric — computed per axis, not per rank pair."""
    from gplan.planner.placement import axis_link_classes

    cluster = load_cluster("dgx-h100", 16384)
    config = ParallelConfig(dp=64, tp=8, pp=16, cp=2)
    links = axis_link_classes(cluster, place(cluster, config, [0] * 16), config)
    assert {axis: kind for axis, (kind, _) in links.items()} == {"tp": "intra", "cp": "inter", "dp": "inter", "pp": "inter"}
    assert links["tp"][1] == cluster.primary.intra_node.bandwidth_GBps
