"""`gplan replan` and `search --what-if-lost`: the best plan on the devices left among the layouts the
plan's checkpoint can be loaded into (EngineProfile.resharding), the batch kept, and bad input refused."""

from __future__ import annotations

import json

import pytest

from gplan.plan import read_plan
from gplan.planner.replan import pins, replan
from gplan.engines import ENGINES
from gplan.engines.profile import LAYOUT_DEGREES


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """Llama 3 70B on 64 H100s, searched as torch and as Megatron-LM runs it."""
    from typer.testing import CliRunner

    from gplan.cli import app

    root, plans = tmp_path_factory.mktemp("replan"), {}
    for target in ("torch", "megatron"):
        out = root / f"{target}.json"
        r = CliRunner().invoke(app, ["search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512",
                                     "--target", target, "--out", str(out)])
        assert r.exit_code == 0, r.stderr
        plans[target] = out
    return plans


def test_every_engine_says_what_its_checkpoints_load_into():
    for name, engine in ENGINES.items():
        rule = engine.resharding
        assert rule.format != "none" and rule.source, f"{name}: no resharding rule"
        assert rule.free <= set(LAYOUT_DEGREES) | {"split"} and rule.optimizer_pins <= rule.free
        assert not rule.optimizer_pins or rule.unpinned_by, f"{name}: a pin with no way out"


def test_the_torch_worker_reshards_everything_megatron_pins_its_optimizer(searched):
    assert pins(read_plan(searched["torch"])) == {}
    megatron = read_plan(searched["megatron"])
    kept = pins(megatron)
    assert {"tp", "pp", "split"} <= set(kept) and "dp" not in kept
    assert all("--dist-ckpt-optim-fully-reshardable" in why for why in kept.values())
    assert pins(megatron, optimizer_reshardable=True) == {}


def test_replan_keeps_the_model_batch_and_target_and_the_pinned_degrees(searched):
    megatron = read_plan(searched["megatron"])
    r = replan(megatron, 56)
    new = r.new
    assert new.model == megatron.model and new.training.gbs == megatron.training.gbs and not r.gbs_note
    assert new.target == megatron.target and new.world_size <= 56
    for degree in ("tp", "pp", "vpp", "cp"):
        assert getattr(new.parallel, degree) == getattr(megatron.parallel, degree), degree
    assert [s.layer_end - s.layer_start for s in new.stages] == [s.layer_end - s.layer_start for s in megatron.stages]
    assert set(r.changed) <= {"dp"} and r.tokens_kept <= 1 + 1e-9


def test_a_torch_plan_may_change_every_degree_and_loses_throughput_not_more_than_devices(searched):
    plan = read_plan(searched["torch"])
    r = replan(plan, 48)
    assert r.new.world_size <= 48 and r.changed and r.optimizer_resharded
    assert r.tokens_kept <= 1 + 1e-9


def test_deepspeed_cannot_convert_experts_so_an_moe_run_keeps_its_devices(tmp_path, gplan):
    out = tmp_path / "moe.json"
    assert gplan("search", "mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64", "--target", "deepspeed",
                 "--out", str(out)).code == 0
    plan = read_plan(out)
    assert set(pins(plan)) == set(LAYOUT_DEGREES) | {"split"}
    r = gplan("replan", str(out), "--lost-nodes", "1", "-o", str(tmp_path / "new.json"))
    assert r.code == 3 and "does not convert routed experts" in r.stderr and not (tmp_path / "new.json").exists()


def test_the_failure_table_at_1024_devices(gplan, tmp_path):
    out = tmp_path / "plan.json"
    r = gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024", "--out", str(out),
              "--what-if-lost", "1,2", "--json")
    assert r.code == 0
    rows = r.json()["what_if_lost"]
    assert [row["nodes_lost"] for row in rows] == [1, 2] and [row["devices"] for row in rows] == [1016, 1008]
    plan = read_plan(out)
    for row in rows:
        assert row["tokens_per_s_kept"] <= 1 + 1e-9 and row["after"]
    text = gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024", "--out", str(out),
                 "--what-if-lost", "1").stderr
    assert "if nodes are lost" in text and plan.world_size


def test_replan_cli_writes_the_plan_and_says_what_is_resharded(searched, gplan, tmp_path):
    out = tmp_path / "new.json"
    r = gplan("replan", str(searched["torch"]), "--lost-nodes", "1", "-o", str(out))
    assert r.code == 0 and out.is_file()
    assert "resharded over" in r.stderr and f"gplan launch {out} --resume-from RUN_DIR" in r.stderr.replace("\n", "")
    data = gplan("replan", str(searched["megatron"]), "--devices", "48", "-o", str(out), "--json").json()
    assert data["kept"] and set(data["resharded"]) <= {"dp"} and json.loads(out.read_text())["training"]["engine"] == "megatron"


@pytest.mark.parametrize("args, code, words", [
    ([], 2, "--devices N or --lost-nodes K"),
    (["--devices", "0"], 3, "0 devices left"),
    (["--devices", "8", "--lost-nodes", "1"], 2, "--devices N or --lost-nodes K"),
])
def test_replan_bad_input_is_one_line(searched, gplan, tmp_path, args, code, words):
    r = gplan("replan", str(searched["torch"]), *args, "-o", str(tmp_path / "new.json"))
    assert r.code == code and words in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "new.json").exists()


def test_fewer_devices_than_the_model_needs(searched, gplan, tmp_path):
    r = gplan("replan", str(searched["torch"]), "--devices", "1", "-o", str(tmp_path / "new.json"))
    assert r.code == 4 and not (tmp_path / "new.json").exists()
    r = gplan("replan", str(searched["torch"]), "--devices", "8", "-o", str(searched["torch"]))
    assert r.code == 3 and "the plan being replanned" in r.stderr


def test_the_docs_table_names_every_engines_checkpoint():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "docs" / "replan.md").read_text()
    table = readme.split("What each engine's checkpoint can be loaded into")[1].split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| engine")]
    assert len(rows) == len(ENGINES)
    for engine in ENGINES.values():
        assert any(engine.resharding.format.split(" (")[0].split(",")[0] in row for row in rows), engine.name


def test_replan_exports_the_engines_files_and_how_to_resume(searched, gplan, tmp_path):
    out, folder = tmp_path / "new.json", tmp_path / "export"
    r = gplan("replan", str(searched["megatron"]), "--lost-nodes", "1", "-o", str(out), "--export", "megatron",
              "--export-dir", str(folder))
    assert r.code == 0, r.stderr
    steps = (folder / "RESUME.md").read_text()
    assert "resharded over: dp" in steps and "Only dp changed" in steps
    assert any(p.suffix == ".sh" for p in folder.iterdir())
    dense = tmp_path / "ds.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-a100-80g", "--devices", "16", "--target", "deepspeed",
                 "--out", str(dense)).code == 0
    r = gplan("replan", str(dense), "--lost-nodes", "1", "-o", str(tmp_path / "ds2.json"), "--export", "deepspeed",
              "--export-dir", str(tmp_path / "dsx"))
    assert r.code == 0, r.stderr
    assert "ds_to_universal" in (tmp_path / "dsx" / "RESUME.md").read_text()
