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
