"""gpt-oss handed to Megatron-LM: its alternating windows, sinks, biases and clamped gated unit as Megatron-LM's
own flags, checked by megatron_rules.py (Megatron-LM's parser and validate_args)."""

from __future__ import annotations

import json

import megatron_rules
from test_exporters import script_args, script_env


def test_the_megatron_export_spells_its_layers_as_megatron_lm_builds_gpt_oss(gplan, tmp_path):
    plan = tmp_path / "plan.json"
    assert gplan("search", "gpt-oss-20b", "--devices", "8", "--cluster", "dgx-h100", "--gbs", "64", "--target",
                 "megatron", "--out", str(plan)).code == 0
    out = tmp_path / "megatron"
    assert gplan("export", str(plan), "--to", "megatron", "-o", str(out)).code == 0
    text = (out / "megatron_pretrain_gpt.sh").read_text()
    data = json.loads(plan.read_text())["parallel"]
    args = megatron_rules.validate(script_args(text, "MEGATRON_ARGS"), data["dp"] * data["tp"] * data["pp"] * data["cp"],
                                   script_env(text), device_arch=9)
    assert args.window_size == (128, 0) and args.window_attn_skip_freq == "2" and args.softmax_type == "learnable"
    assert args.quick_geglu and not args.swiglu and args.glu_linear_offset == 1.0
    assert args.activation_func_clamp_value == 7.0 and not args.disable_bias_linear
    # read back by --from as the same model at the same price; a launch of another pattern is not this model
    back = gplan("estimate", "gpt-oss-20b", "--from", str(out / "megatron_pretrain_gpt.sh"), "--cluster", "dgx-h100",
                 "--json").json()
    assert back["step_time_s"] == json.loads(plan.read_text())["prediction"]["step_time_s"]
    other = tmp_path / "every4.sh"
    other.write_text(text.replace("--window-attn-skip-freq 2", "--window-attn-skip-freq 4"))
    r = gplan("estimate", "gpt-oss-20b", "--from", str(other), "--cluster", "dgx-h100")
    assert r.code == 3 and "--window-attn-skip-freq 4, but gpt-oss-20b has 2" in r.stderr
