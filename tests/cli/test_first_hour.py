"""A newcomer's first hour (issue 31): say what was understood, the cause of a refusal first, errors as
JSON under --json, a word when the best plan idles, the targets that run a refused model, Ctrl-C."""

from __future__ import annotations

import json

import pytest
from helpers import cli_json


def test_validate_and_the_search_header_show_the_models_size(gplan, tmp_path):
    config = tmp_path / "config.json"  # a Hugging Face Mixtral-like config: total and active differ
    config.write_text(json.dumps({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 1024,
        "intermediate_size": 3584, "num_attention_heads": 16, "num_hidden_layers": 4, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 4096, "num_local_experts": 8, "num_experts_per_tok": 2,
        "rope_theta": 1e6, "hidden_act": "silu", "tie_word_embeddings": False}))
    from gplan.profiles.catalogue import load_model

    spec = load_model(str(config))
    r = gplan("validate", str(config), "--json")
    facts = r.json()["model"]
    assert facts["params"] == spec.total_params() and facts["active_params"] == spec.active_params() < spec.total_params()
    assert (facts["layers"], facts["hidden_size"], facts["experts"], facts["top_k"]) == (4, 1024, 8, 2)
    text = gplan("validate", str(config)).stderr
    assert "params" in text and "active" in text and "4 layers, hidden 1024" in text
    header = gplan("search", "llama3-8b", "--devices", "8", "--out", str(tmp_path / "p.json")).stderr
    assert "llama3-8b (8.03B params; 32 layers, hidden 4096, 32 heads (8 kv))" in header


def test_an_edited_degree_is_refused_for_its_cause(gplan, tmp_path):
    path = tmp_path / "p.json"
    assert gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512",
                 "--out", str(path)).code == 0
    plan = json.loads(path.read_text())
    plan["parallel"]["tp"] *= 2
    path.write_text(json.dumps(plan))
    r = gplan("validate", str(path))
    assert r.code == 3 and "dp·tp·pp·cp" in r.stderr and "≠ the 64 devices" in r.stderr


@pytest.mark.parametrize("args, code", [
    (["search", "no-such-model", "--devices", "8"], 3),
    (["estimate", "llama3-8b", "--devices", "8", "--tp", "3"], 3),
    (["explain", "missing.json"], 3),
    (["search", "llama3-405b", "--devices", "8"], 4),
])
def test_json_errors_are_one_document_on_stdout(gplan, tmp_path, args, code):
    r = gplan(*args, "--json")
    assert r.code == code
    doc = cli_json(r.stdout)
    assert doc["ok"] is False and doc["error"]["exit_code"] == code and doc["error"]["message"]
    assert doc["command"] == args[0] and "error:" in r.stderr


def test_a_large_bubble_is_named_with_what_shrinks_it(gplan, tmp_path):
    r = gplan("search", "llama3-405b", "--cluster", "dgx-h100", "--devices", "16384", "--out", str(tmp_path / "p.json"))
    assert r.code == 0
    line = next(x for x in r.stderr.splitlines() if "pipeline bubble is" in x)
    plan = json.loads((tmp_path / "p.json").read_text())
    assert f"{plan['prediction']['breakdown']['bubble'] / plan['prediction']['step_time_s']:.0%}" in line
    assert "--gbs" in r.stderr
    quiet = gplan("search", "llama3-8b", "--devices", "8", "--out", str(tmp_path / "q.json"))
    assert "pipeline bubble is" not in quiet.stderr


def test_a_refused_model_names_the_targets_that_run_it(gplan, tmp_path):
    config = tmp_path / "config.json"  # Mistral 7B: a 4096-token sliding window, which gplan's worker does not run
    config.write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "vocab_size": 32000, "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096,
        "hidden_act": "silu", "tie_word_embeddings": False}))
    r = gplan("search", str(config), "--cluster", "dgx-h100", "--devices", "8", "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "megatron runs it" in r.stderr and "hint: --target megatron" in r.stderr
    assert gplan("search", str(config), "--cluster", "dgx-h100", "--devices", "8", "--target", "megatron",
                 "--out", str(tmp_path / "p.json")).code == 0


@pytest.mark.parametrize("command, args, patch", [
    ("search", ["llama3-8b", "--devices", "8"], "gplan.planner.plan"),
    ("explain", ["PLAN"], "gplan.planner.explain.explain"),
    ("estimate", ["llama3-8b", "--devices", "8", "--tp", "8"], "gplan.planner.complete.complete"),
])
def test_ctrl_c_exits_130_with_a_line_saying_what_stopped(gplan, monkeypatch, tmp_path, command, args, patch):
    plan = tmp_path / "p.json"
    assert gplan("search", "llama3-8b", "--devices", "8", "--out", str(plan)).code == 0
    module, name = patch.rsplit(".", 1)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(module + "." + name, interrupted)
    r = gplan(command, *[str(plan) if a == "PLAN" else a for a in args], "--out" if command == "search" else "--json",
              *([str(tmp_path / "new.json")] if command == "search" else []))
    assert r.code == 130
    assert f"gplan {command} stopped by Ctrl-C" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "new.json").exists()


def test_every_command_answers_json_in_one_envelope(gplan, tmp_path):
    """Every command's `--json` is one document of one shape: gplan's version, the command, ok, data."""
    import json

    from gplan import __version__

    plan = tmp_path / "plan.json"
    runs = {
        "search": ["search", "llama3-8b", "--devices", "8", "--out", str(plan)],
        "estimate": ["estimate", "llama3-8b", "--devices", "8", "--tp", "2"],
        "compare": ["compare", "llama3-8b", "--devices", "8", "--config", "tp=2", "--config", "tp=4"],
        "explain": ["explain", str(plan)],
        "export": ["export", str(plan), "--to", "slurm", "-o", str(tmp_path / "out")],
        "launch": ["launch", str(plan), "--dry-run"],
        "models": ["models"], "hardware": ["hardware"], "validate": ["validate", str(plan)],
    }
    for command, args in runs.items():
        r = gplan(*args, "--json")
        assert r.code == 0, (command, r.stderr)
        document = json.loads(r.stdout)
        assert (document["gplan"], document["command"], document["ok"]) == (__version__, command, True)
        assert set(document) == {"gplan", "command", "ok", "data"} and document["data"]


def test_a_gpu_plan_launched_on_cpus_says_how_long_a_step_takes_first(gplan, tmp_path):
    """A plan searched for GPUs keeps its ~4M-token batch: on CPUs a step would take days. The launch says
    so before anything starts, with the batch that brings it down."""
    plan = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--out", str(plan)).code == 0
    r = gplan("launch", str(plan), "--device", "cpu", "--dry-run")
    text = " ".join(r.stderr.split())
    assert r.code == 0 and "one step of this plan on CPUs takes about" in text and "--gbs" in text
    small = tmp_path / "cpu.json"
    assert gplan("search", "tiny-llama", "--cluster", "local-cpu", "--devices", "2", "--out", str(small)).code == 0
    assert "one step of this plan on CPUs" not in gplan("launch", str(small), "--device", "cpu", "--dry-run").stderr
