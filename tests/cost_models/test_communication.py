"""Alpha-beta collectives, axis spans and the link a group rides."""

from __future__ import annotations

import pytest

from gplan.cost_models import communication as comm
from gplan.cost_models.pipeline import bubble_time_s, pipeline_time_s
from gplan.profiles.schema import LinkSpec
from gplan.spec.parallel import ParallelConfig

LINK = LinkSpec(bandwidth_GBps=100, latency_us=10, efficiency=1.0)


def test_ring_allreduce_by_hand():
    # 2·(8−1)/8 · 1 GB / 100 GB/s + 2·7·10 µs
    assert comm.ring_allreduce_time_s(1e9, 8, LINK) == pytest.approx(2 * 7 / 8 * 0.01 + 14 * 10e-6)


def test_allgather_and_reduce_scatter_are_half_an_allreduce_without_latency():
    link = LINK.model_copy(update={"latency_us": 0})
    assert comm.allgather_time_s(1e9, 16, link) * 2 == pytest.approx(comm.ring_allreduce_time_s(1e9, 16, link))
    assert comm.reduce_scatter_time_s(1e9, 16, link) == comm.allgather_time_s(1e9, 16, link)


def test_single_device_groups_cost_nothing():
    assert comm.ring_allreduce_time_s(1e9, 1, LINK) == 0
    assert comm.allgather_time_s(1e9, 1, LINK) == 0


def test_p2p():
    assert comm.p2p_time_s(1e8, LINK) == pytest.approx(1e-3 + 10e-6)


def test_axis_spans_follow_tp_cp_dp_pp_order():
    c = ParallelConfig(dp=4, tp=8, pp=2, cp=2)
    assert comm.axis_span(c, "tp") == 8
    assert comm.axis_span(c, "cp") == 16
    assert comm.axis_span(c, "dp") == 64
    assert comm.axis_span(c, "pp") == 128


def test_group_links(a100_cluster):
    group = a100_cluster.primary
    c = ParallelConfig(dp=8, tp=8)
    assert comm.axis_link(group, c, "tp") == group.intra_node
    assert comm.axis_link(group, c, "dp") == group.inter_node  # one dp member per node
    fsdp = ParallelConfig(dp=64)
    # eight members per node drive eight NICs: 8 × 25 GB/s, below NVLink's 300
    assert comm.axis_link(group, fsdp, "dp").bandwidth_GBps == 200
    assert comm.members_per_node(ParallelConfig(dp=16, tp=2), "dp", 8) == 4


def test_uniform_pipeline_bubbles():
    p, m, t = 8, 32, 1.0
    assert pipeline_time_s([t] * p, m) == pytest.approx((m + p - 1) * t)
    assert bubble_time_s([t] * p) / (m * t) == pytest.approx((p - 1) / m)
    assert bubble_time_s([t] * p, vpp=4) / (m * t) == pytest.approx((p - 1) / (m * 4))
    assert pipeline_time_s([t] * p, m, vpp=4) == pytest.approx(m * t + (p - 1) * t / 4)
