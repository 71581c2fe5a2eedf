"""`gplan compare`: configurations of one model, or plans, side by side."""

from __future__ import annotations

import json

ARGS = ["compare", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512"]


def test_compare_configurations_json(gplan):
    r = gplan(*ARGS, "--config", "tp=8,pp=4,sp=1,recompute=full", "--config", "tp=2,pp=1,zero=3,sp=1,recompute=full", "--json")
    assert r.code == 0
    data = r.json()
    assert [d["name"] for d in data] == ["tp=8,pp=4,sp=1,recompute=full", "tp=2,pp=1,zero=3,sp=1,recompute=full"]
    assert data[0]["prediction"]["breakdown"]["tp_comm"] > data[1]["prediction"]["breakdown"]["tp_comm"]


def test_compare_names_the_term_that_grew(gplan):
    r = gplan(*ARGS, "--config", "tp=8,pp=4,sp=1,recompute=full", "--config", "tp=2,pp=1,zero=3,sp=1,recompute=full")
    assert r.code == 0 and "slower than" in r.stderr and "tp_comm grew most" in r.stderr


def test_compare_plans(gplan, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert gplan("search", "llama3-8b", "--devices", "8", "--out", str(a)).code == 0
    assert gplan("search", "llama3-8b", "--devices", "8", "--pp", "2", "--out", str(b)).code == 0
    r = gplan("compare", str(a), str(b), "--json")
    assert r.code == 0 and len(r.json()) == 2


def test_compare_bad_config_exit_3(gplan):
    assert gplan(*ARGS, "--config", "tp=eight").code == 3
    assert gplan(*ARGS, "--config", "tp=3,pp=4").code == 3
    assert gplan("compare", "only-one.json").code == 3


def test_compare_ranks_by_time_per_token_when_batches_differ(gplan, tmp_path):
    """Twice the batch takes about twice the step time: ranking by step time would call the plan with
    the higher throughput "slower". Ranked per token, the one with more tokens/s wins."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert gplan("search", "llama3-8b", "--devices", "8", "--gbs", "64", "--out", str(a)).code == 0
    assert gplan("search", "llama3-8b", "--devices", "8", "--gbs", "256", "--out", str(b)).code == 0
    data = gplan("compare", str(a), str(b), "--json").json()
    tps = {d["name"]: d["prediction"]["tokens_per_s"] for d in data}
    faster, slower = sorted(tps, key=tps.get, reverse=True)
    r = gplan("compare", str(a), str(b))
    assert "ranked by time per token" in r.stderr and "time / 1M tokens" in r.stderr
    assert f"{slower} is" in r.stderr and f"slower per token than {faster}" in r.stderr


def test_compare_shows_each_configuration(gplan, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert gplan("search", "llama3-8b", "--devices", "8", "--gbs", "64", "--out", str(a)).code == 0
    assert gplan("search", "llama3-8b", "--devices", "8", "--gbs", "64", "--pp", "2", "--out", str(b)).code == 0
    data = gplan("compare", str(a), str(b), "--json").json()
    plans = [json.loads(p.read_text()) for p in (a, b)]
    for entry, plan in zip(data, plans):
        c = plan["parallel"]
        assert entry["configuration"]["dp tp pp"].split()[::2] == [str(c["dp"]), str(c["pp"])]
        assert entry["configuration"]["gbs × seq"] == f"{plan['training']['gbs']} × {plan['training']['seq_length']}"
    text = gplan("compare", str(a), str(b)).stderr
    assert "dp tp pp" in text and "gbs × seq" in text and "per token" not in text  # same batch: per step
