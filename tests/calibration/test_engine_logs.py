"""`gplan calibrate` on engine logs (engines.megatron.logs, engines.torchtitan.logs). The fixtures are written from
Megatron-LM's own format strings (`_print_args` in megatron/training/arguments.py; `training_log` in
megatron/training/training.py; `report_memory` in megatron/training/utils.py) with the numbers of
Megatron-Bridge's published H100 FP8 rows (../shared/reference/megatron_bridge_perf.csv, rows 70, 250, 39:
Llama 3 70B on 64 GPUs, Llama 3 8B on 8, Llama 3.1 405B on 1024); DeepSpeed's lines from DeepSpeed 0.19's
`DeepSpeedConfig.print` (runtime/config.py) and `ThroughputTimer.stop` (utils/timer.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gplan.engines.megatron.logs import read_megatron_log
from gplan.calibration.runs import read_log_run
from gplan.errors import InputError

LLAMA = dict(group_query_attention=True, swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
             untie_embeddings_and_output_weights=True, add_bias_linear=False, add_qkv_bias=False, seq_length=8192,
             max_position_embeddings=8192, rotary_base=500000, padded_vocab_size=128256, tokenizer_type="NullTokenizer",
             micro_batch_size=1, sequence_parallel=True, use_distributed_optimizer=True, context_parallel_size=1,
             recompute_granularity=None, recompute_method=None, recompute_num_layers=None, fp8="hybrid",
             fp8_recipe="tensorwise", bf16=True, fp16=False, num_experts=None, lr=0.00015, data_path=["/data/x"],
             pipeline_model_parallel_layout=None, decoder_first_pipeline_num_layers=None,
             decoder_last_pipeline_num_layers=None, tp_comm_overlap=True,  # Bridge's recipes overlap
             overlap_grad_reduce=True, overlap_param_gather=True)
#: (Bridge row, arguments, tokens/s per GPU)
ROWS = {
    "llama3-70b-row70": (dict(LLAMA, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                              num_query_groups=8, kv_channels=128, tensor_model_parallel_size=4,
                              pipeline_model_parallel_size=8, virtual_pipeline_model_parallel_size=5,
                              global_batch_size=256, world_size=64, data_parallel_size=2), 1664),
    "llama3-8b-row250": (dict(LLAMA, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                              num_query_groups=8, kv_channels=128, tensor_model_parallel_size=1,
                              pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                              global_batch_size=128, world_size=8, data_parallel_size=8, sequence_parallel=False,
                              use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params"), 14451),
    "llama3.1-405b-row39": (dict(LLAMA, num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
                                 num_attention_heads=128, num_query_groups=8, kv_channels=128,
                                 tensor_model_parallel_size=8, pipeline_model_parallel_size=8, context_parallel_size=2,
                                 virtual_pipeline_model_parallel_size=8, global_batch_size=1536, world_size=1024,
                                 data_parallel_size=8), 326),
}


def megatron_log(args: dict, step_s: float, iterations: int = 6, skipped_at: int | None = None,
                 crash: bool = False) -> str:
    """A rank-0 log: the arguments block, a memory report, one line per logged iteration."""
    lines = ["------------------------ arguments ------------------------"]
    for line in sorted((f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()), key=str.lower):
        lines.append(line)
    lines.append("-------------------- end of arguments ---------------------")
    lines.append("[Rank 0] (after 1 iterations) memory (MB) | allocated: 30528.1 | max allocated: 61234.5 | "
                 "reserved: 63000.0 | max reserved: 63000.0")
    for i in range(1, iterations + 1):
        ms = step_s * 1000 * (1.6 if i == 1 else 1.0 + 0.002 * (i % 3))  # the first interval compiles and warms up
        skipped = 1 if i == skipped_at else 0
        lines.append(f" [2026-05-01 10:{i:02d}:00] iteration {i:8d}/{500:8d} | consumed samples: {i * args['global_batch_size']:12d} | "
                     f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 400.0 | "
                     f"learning rate: {1.5e-4:.6E} | global batch size: {args['global_batch_size']:5d} | lm loss: "
                     f"{10.5 - i * 0.01:.6E} | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations: "
                     f"{skipped:3d} | number of nan iterations: {0:3d} |")
    if crash:
        lines += ["Traceback (most recent call last):", '  File "pretrain_gpt.py", line 1', "RuntimeError: NCCL error"]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, name: str, **kw) -> Path:
    args, tokens_per_gpu = ROWS[name]
    step_s = args["global_batch_size"] * args["seq_length"] / (tokens_per_gpu * args["world_size"])
    path = tmp_path / f"{name}.log"
    path.write_text(megatron_log(args, step_s, **kw))
    return path


def test_the_log_gives_the_rows_configuration_and_step_exactly(tmp_path):
    path = write(tmp_path, "llama3-70b-row70")
    log = read_megatron_log(path)
    assert log.step_s == pytest.approx(256 * 8192 / (1664 * 64), rel=3e-3)  # the median after the warm-up interval
    assert log.max_allocated_bytes == pytest.approx(61234.5 * 2**20)
    run = read_log_run(path, "dgx-h100", None, None)
    c, m, t = run.plan.parallel, run.plan.model, run.plan.training
    assert (c.dp, c.tp, c.pp, c.vpp, c.cp, c.sp, c.mbs, c.zero) == (2, 4, 8, 5, 1, True, 1, 1)
    assert (t.gbs, t.seq_length, t.precision, t.engine) == (256, 8192, "fp8", "megatron")
    from gplan.profiles.catalogue import load_model

    bundled = load_model("llama3-70b")
    assert m.total_params() == bundled.total_params() and m.kv_heads == 8 and m.rope_theta == 500000


def test_a_logs_engine_switches_price_the_run_as_it_ran(tmp_path):
    """`gplan calibrate` prices a Megatron log with the switches its arguments set (bf16 gradients, FP8
    parameters), as `--from` does: their memory is the run's, not fp32 gradients beside 16-bit weights."""
    args, tokens_per_gpu = ROWS["llama3-70b-row70"]
    step_s = args["global_batch_size"] * args["seq_length"] / (tokens_per_gpu * args["world_size"])
    plain, switched = tmp_path / "plain.log", tmp_path / "switched.log"
    plain.write_text(megatron_log(args, step_s))
    switched.write_text(megatron_log(dict(args, grad_reduce_in_bf16=True, fp8_param_gather=True), step_s))
    runs = [read_log_run(p, "dgx-h100", None, None).plan for p in (plain, switched)]
    assert not runs[0].training.grad_reduce_in_bf16
    assert runs[1].training.grad_reduce_in_bf16 and runs[1].training.fp8_param_gather
    assert runs[1].prediction.memory_bytes_per_device_max < runs[0].prediction.memory_bytes_per_device_max


def test_a_log_without_megatrons_overlap_switches_prices_that_communication_exposed(tmp_path):
    """Megatron-LM's overlaps are off by default: a log printing `tp_comm_overlap False` (and the gradient
    reduction's and parameter gather's switches off) ran that communication beside its compute, not behind it, and
    is priced so — slower, the tp and dp time exposed; the same log with them on is priced overlapped."""
    args, tokens_per_gpu = ROWS["llama3-70b-row70"]
    step_s = args["global_batch_size"] * args["seq_length"] / (tokens_per_gpu * args["world_size"])
    plans = []
    for on in (True, False):
        path = tmp_path / f"overlap_{on}.log"
        path.write_text(megatron_log(dict(args, tp_comm_overlap=on, overlap_grad_reduce=on, overlap_param_gather=on),
                                     step_s))
        plans.append(read_log_run(path, "dgx-h100", None, None).plan)
    assert [(p.training.tp_comm_overlap, p.training.grad_reduce_overlap) for p in plans] == [(True, True), (False, False)]
    overlapped, exposed = (p.prediction for p in plans)
    assert exposed.breakdown.tp_comm > 10 * overlapped.breakdown.tp_comm
    assert exposed.breakdown.dp_comm > overlapped.breakdown.dp_comm
    assert exposed.step_time_s > overlapped.step_time_s


def test_a_logs_precision_aware_optimizer_prices_adams_states_as_it_kept_them(tmp_path):
    """A log's printed optimizer dtypes (`torch.bfloat16`) are read as `--from` reads the flags: bf16 moments
    under the precision-aware optimizer, and a bf16 main gradient as a bf16 gradient buffer (validate_args turns
    the fp32 accumulation off); without the optimizer those dtypes are refused, as Megatron refuses them."""
    args, tokens_per_gpu = ROWS["llama3-70b-row70"]
    step_s = args["global_batch_size"] * args["seq_length"] / (tokens_per_gpu * args["world_size"])
    dtypes = {"exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.bfloat16",
              "main_params_dtype": "torch.float32", "main_grads_dtype": "torch.bfloat16"}
    plain, aware = tmp_path / "plain.log", tmp_path / "aware.log"
    plain.write_text(megatron_log(args, step_s))
    aware.write_text(megatron_log(dict(args, use_precision_aware_optimizer=True, **dtypes), step_s))
    runs = [read_log_run(p, "dgx-h100", None, None).plan for p in (plain, aware)]
    t = runs[1].training
    assert t.precision_aware_optimizer and t.adam_moments == "bf16" and t.master_weights == "fp32"
    assert t.grad_reduce_in_bf16 and not runs[0].training.precision_aware_optimizer
    assert runs[1].prediction.memory_bytes_per_device_max < runs[0].prediction.memory_bytes_per_device_max
    offloaded = tmp_path / "offloaded.log"  # half the states on the host, the copies overlapped
    offloaded.write_text(megatron_log(dict(args, use_precision_aware_optimizer=True, optimizer_cpu_offload=True,
                                           optimizer_offload_fraction=0.5, overlap_cpu_optimizer_d2h_h2d=True,
                                           **dtypes), step_s))
    half = read_log_run(offloaded, "dgx-h100", None, None).plan
    assert half.training.optimizer_offload == 0.5 and half.training.optimizer_offload_overlap
    assert half.prediction.memory_bytes_per_device_max < runs[1].prediction.memory_bytes_per_device_max
    refused = tmp_path / "refused.log"
    refused.write_text(megatron_log(dict(args, use_precision_aware_optimizer=False, **dtypes), step_s))
    with pytest.raises(InputError, match="without --use-precision-aware-optimizer"):
        read_log_run(refused, "dgx-h100", None, None)


def test_skipped_iterations_are_left_out_of_the_steady_step(tmp_path):
    args, _ = ROWS["llama3-8b-row250"]
    path = tmp_path / "skip.log"
    path.write_text(megatron_log(args, 1.0, iterations=6, skipped_at=3).replace(
        "elapsed time per iteration (ms): 1002.0 | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: "
        "1.500000E-04 | global batch size:   128 | lm loss: 1.047000E+01 | loss scale: 1.0 | grad norm: 1.000 | "
        "number of skipped iterations:   1",
        "elapsed time per iteration (ms): 9000.0 | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: "
        "1.500000E-04 | global batch size:   128 | lm loss: 1.047000E+01 | loss scale: 1.0 | grad norm: 1.000 | "
        "number of skipped iterations:   1"))
    log = read_megatron_log(path)
    assert log.intervals == 4 and log.step_s < 1.01


def test_calibrate_fits_megatron_logs_and_predicts_a_held_out_one(gplan, tmp_path):
    fit = [write(tmp_path, "llama3-70b-row70"), write(tmp_path, "llama3-8b-row250")]
    held = write(tmp_path, "llama3.1-405b-row39")
    r = gplan("calibrate", *map(str, fit), "--held-out", str(held), "--cluster", "dgx-h100",
              "--out", str(tmp_path / "p.yaml"), "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert len(data["runs"]) == 2 and len(data["held_out"]) == 1
    assert all(abs(run["error_after"]) < 0.02 for run in data["runs"])  # two runs, two parameters: fitted
    assert abs(data["held_out"][0]["error_after"]) < 0.25
    assert (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("change, fragment", [
    (lambda t: t.replace("  world_size ", "  world_sizeX "), "has no world_size"),
    (lambda t: t.split("-------------------- end of arguments")[0], "cut short"),
    (lambda t: t.split(" [2026-05-01 10:02:00]")[0], "none after the first 1"),
    (lambda t: "step: 10  loss: 3.2  memory: 40.1GiB(50%)  tps: 6,150  tflops: 350  mfu: 35%\n", "a torchtitan log"),
])
def test_a_log_that_cannot_be_priced_whole_is_refused(gplan, tmp_path, change, fragment):
    path = write(tmp_path, "llama3-8b-row250")
    path.write_text(change(path.read_text()))
    other = write(tmp_path, "llama3-70b-row70")
    r = gplan("calibrate", str(path), str(other), "--cluster", "dgx-h100", "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and fragment in r.stderr and "hint:" in r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_a_crashed_run_and_a_log_without_hardware_are_refused(gplan, tmp_path):
    crashed = write(tmp_path, "llama3-8b-row250", crash=True)
    other = write(tmp_path, "llama3-70b-row70")
    r = gplan("calibrate", str(crashed), str(other), "--cluster", "dgx-h100", "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and "crashed" in r.stderr
    r = gplan("calibrate", str(other), str(other), "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and "does not name its hardware" in r.stderr and "--cluster" in r.stderr


# ---- torchtitan --------------------------------------------------------------------------------------

CHUNKED_LOSS = {"num_chunks": 8, "loss_fn": {"global_vocab_size": 128256}}
"""0.3's ChunkedLossWrapper.Config as its trainer prints it (every registered trainer config wraps the loss so)."""


def torchtitan_log(tokens_per_device_s: float, steps: int = 6, shard: int = -1, loss: dict | None = CHUNKED_LOSS) -> str:
    """A rank-0 torchtitan 0.3 log: `Running with configs:` (trainer.py, --debug.print_config), the mesh line
    (distributed/parallel_dims.py), step lines in metrics.py's format with its colour codes."""
    config = {"job": {"description": "Llama 3 8B training"},
              "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": shard,
                              "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "context_parallel_degree": 1,
                              "expert_parallel_degree": 1, "fsdp_reshard_after_forward": "default"},
              "training": {"local_batch_size": 1, "global_batch_size": -1, "seq_len": 8192,
                           "mixed_precision_param": "bfloat16", "steps": 100},
              "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"},
              "model_spec": {"name": "llama3", "flavor": "8B", "model": {"dim": 4096}},
              **({"loss": loss} if loss is not None else {})}
    lines = ["[titan] 2026-05-01 10:00:00,000 - root - INFO - Starting job: Llama 3 8B training",
             "[titan] 2026-05-01 10:00:00,001 - root - INFO - Running with configs: " + json.dumps(config, indent=2),
             "[titan] 2026-05-01 10:00:01,000 - root - INFO - Building device mesh with parallelism: pp=1, "
             "dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1"]
    for step in range(1, steps + 1):
        tps = tokens_per_device_s * (0.3 if step == 1 else 1.0)
        lines.append(f"[titan] 2026-05-01 10:0{step}:00,000 - root - INFO - \x1b[31mstep: {step:2}  \x1b[32mloss: "
                     f"{8.0 - step * 0.1:8.5f}  \x1b[33mgrad_norm: {1.0:7.4f}  \x1b[36mmemory: {47.65:5.2f}GiB(50.16%)  "
                     f"\x1b[34mtps: {round(tps):,}  \x1b[36mtflops: {350.0:,.2f}  \x1b[35mmfu: 35.00%\x1b[39m")
    return "\n".join(lines) + "\n"


def test_a_torchtitan_log_gives_its_configuration_and_step(tmp_path):
    """torchao's float8 README, H100: Llama 3 8B on 8 GPUs, batch 1 × 8192, FSDP2, per-op SAC, 6150 tokens/s
    per GPU in BF16 — a step of 8 × 8192 / (6150 × 8) s."""
    path = tmp_path / "titan.log"
    path.write_text(torchtitan_log(6150))
    run = read_log_run(path, "dgx-h100", None, None)
    c, t = run.plan.parallel, run.plan.training
    # per-op selective AC: torchtitan's own policy, the recompute module op (not priced as full recompute)
    assert (c.dp, c.tp, c.pp, c.zero, c.mbs, c.recompute, c.recompute_modules) == (8, 1, 1, 3, 1, "selective", ("op",))
    assert (t.gbs, t.seq_length, t.precision, t.engine) == (8, 8192, "bf16", "torchtitan")
    assert run.measured_step_s == pytest.approx(8 * 8192 / (6150 * 8))
    assert run.plan.model.name == "llama3-8b"


@pytest.mark.parametrize("loss, chunks", [(CHUNKED_LOSS, 8), ({"num_chunks": 4, "loss_fn": {}}, 4),
                                          ({"global_vocab_size": 128256}, 1), (None, 1)])
def test_a_torchtitan_log_prices_the_loss_in_the_chunks_it_printed(tmp_path, loss, chunks):
    """0.3's printed `loss`: ChunkedLossWrapper's num_chunks, or a whole CrossEntropyLoss; ≤ 0.2 prints none."""
    path = tmp_path / "titan.log"
    path.write_text(torchtitan_log(6150, loss=loss))
    assert read_log_run(path, "dgx-h100", None, None).plan.training.loss_chunks_run == chunks


@pytest.mark.parametrize("printed, recompute", [
    # torchtitan 0.3 prints its policy's config by its fields, no `mode`: SelectiveAC (per-op) or FullAC
    ({"force_recompute_mm_shapes_by_fqns": ["moe.router.gate"], "preserve_rng_state": False}, ("selective", ("op",))),
    ({"preserve_rng_state": False, "determinism_check": "default"}, ("full", ("core_attn",))),
])
def test_a_torchtitan_03_log_names_its_policy_by_the_fields_it_prints(tmp_path, printed, recompute):
    text = torchtitan_log(6150).replace(json.dumps({"mode": "selective", "selective_ac_option": "op"}, indent=2)
                                        .replace("\n", "\n  "), json.dumps(printed, indent=2).replace("\n", "\n  "))
    assert json.dumps(printed, indent=2).replace("\n", "\n  ") in text
    path = tmp_path / "titan.log"
    path.write_text(text)
    c = read_log_run(path, "dgx-h100", None, None).plan.parallel
    assert (c.recompute, c.recompute_modules) == recompute


def test_calibrate_mixes_engines_and_reports_the_other_engines_prediction_apart(gplan, tmp_path):
    """Fit on two torchtitan runs (torchao's README: 6150 tokens/s; torchtitan commit 7a04053: 5760), predict a
    Megatron-LM run on the same GPUs: reported as another engine's."""
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text(torchtitan_log(6150))
    second.write_text(torchtitan_log(5760))
    held = write(tmp_path, "llama3-8b-row250")
    r = gplan("calibrate", str(first), str(second), "--held-out", str(held), "--cluster", "dgx-h100",
              "--out", str(tmp_path / "p.yaml"), "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["engines"] == ["torchtitan"] and data["held_out"][0]["engine"] == "megatron"
    assert data["held_out"][0]["other_engine"] is True
    text = gplan("calibrate", str(first), str(second), "--held-out", str(held), "--cluster", "dgx-h100",
                 "--out", str(tmp_path / "q.yaml")).stderr
    assert "another" in text and "(held out" in text  # the run's row says so (wrapped at this width)


@pytest.mark.parametrize("change, fragment", [
    (lambda t: t.replace("Running with configs:", "Running:"), "does not print its job config"),
    (lambda t: t.split("\x1b[31mstep:  2")[0], "none after step 2"),
    (lambda t: t.replace('"flavor": "8B"', '"flavor": "13B"'), "no bundled model"),  # not a flavor torchtitan ships
    (lambda t: t.replace("dp_shard=8", "dp_sh=8"), "does not say how many devices"),
])
def test_a_torchtitan_log_that_cannot_be_priced_whole_is_refused(gplan, tmp_path, change, fragment):
    path = tmp_path / "titan.log"
    path.write_text(change(torchtitan_log(6150)))
    other = tmp_path / "other.log"
    other.write_text(torchtitan_log(5760))
    r = gplan("calibrate", str(path), str(other), "--cluster", "dgx-h100", "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and fragment in r.stderr and not (tmp_path / "p.yaml").exists()


def test_a_megatron_deepspeed_log_is_priced_as_deepspeed_runs_it(tmp_path):
    """Megatron-DeepSpeed prints Megatron's arguments block (its fork) with deepspeed, zero_stage and
    checkpoint_activations, and its own names for kv heads and rotary embeddings."""
    args, _ = ROWS["llama3-8b-row250"]
    ds = {k: v for k, v in args.items() if k not in ("group_query_attention", "num_query_groups", "position_embedding_type",
                                                       "rotary_base", "use_distributed_optimizer")}
    ds |= dict(deepspeed=True, zero_stage=3, checkpoint_activations=True, num_key_value_heads=8,
               use_rotary_position_embeddings=True, rotary_position_embeddings_theta=500000, normalization="rmsnorm",
               deepspeed_config="ds_config.json")
    path = tmp_path / "mds.log"
    path.write_text(megatron_log(ds, 10.0))
    run = read_log_run(path, "dgx-h100", None, None)
    c, m = run.plan.parallel, run.plan.model
    assert run.plan.training.engine == "deepspeed" and run.plan.target == "deepspeed"
    assert (c.dp, c.zero, c.recompute) == (8, 3, "full") and (m.kv_heads, m.rope_theta, m.norm) == (8, 500000, "rmsnorm")


def test_runs_of_two_engines_fit_the_compute_speed_and_the_other_engines_factor(gplan, tmp_path):
    """Two Megatron-LM logs and two torchtitan logs of one cluster: the compute speed fits Megatron's (the
    engine most runs used), `engine_factor:torchtitan` the FSDP stack's own speed — the profile carries it
    as the engine's efficiency, so `--profile` prices each engine's plans at its own."""
    runs = [write(tmp_path, "llama3-70b-row70"), write(tmp_path, "llama3-8b-row250")]
    for name, tps in (("a.log", 6150), ("b.log", 5760)):
        (tmp_path / name).write_text(torchtitan_log(tps))
        runs.append(tmp_path / name)
    out = tmp_path / "p.yaml"
    r = gplan("calibrate", *map(str, runs), "--cluster", "dgx-h100", "--out", str(out), "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert "engine_factor:torchtitan" in data["fitted"] and data["fitted"][0] == "compute_scale"
    factor = data["theta"]["engine_factor:torchtitan"]
    assert 0.3 < factor < 1.0  # the FSDP runs reach less of the device than gplan's catalogue assumes
    assert all(abs(run["error_after"]) < 0.1 for run in data["runs"])
    from gplan.profiles.files import read_profile

    assert read_profile(out).node_groups[0].hardware.engine_efficiency["torchtitan"] == pytest.approx(factor)


#: The Bridge rows' own columns (megatron_bridge_perf.csv: system, GPUs, precision, seq, gbs, mbs, tp, pp, cp, vp,
#: fsdp, tokens/s/GPU), so that the test needs no file outside the repository.
BRIDGE_ROWS = {"llama3-70b-row70": ("llama3-70b", 64, "fp8", 8192, 256, 1, 4, 8, 1, 5, 0, 1664),
               "llama3-8b-row250": ("llama3-8b", 8, "fp8", 8192, 128, 1, 1, 1, 1, 1, 8, 14451),
               "llama3.1-405b-row39": ("llama3-405b", 1024, "fp8", 8192, 1536, 1, 8, 8, 2, 8, 0, 326)}


@pytest.mark.parametrize("name", sorted(BRIDGE_ROWS))
def test_a_bridge_rows_log_is_priced_and_measured_as_the_bench_prices_and_measures_the_row(tmp_path, name):
    """The log written from Megatron's formats with a Bridge row's numbers: the same configuration, the same
    measured step and the same prediction as bench/accuracy.py's case of that row (built as its
    `load_bridge_cases` builds it, priced by its `_bridge_predict` at the catalogue's FP8 factor, which that
    bench fitted)."""
    import sys

    from golden import ROOT
    from gplan.profiles.catalogue import load_cluster, load_model
    from gplan.spec.parallel import ParallelConfig
    from gplan.spec.training import TrainingSpec

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import accuracy
    finally:
        sys.path.remove(str(ROOT / "bench"))
    model, gpus, precision, seq, gbs, mbs, tp, pp, cp, vp, fsdp, tokens = BRIDGE_ROWS[name]
    config = ParallelConfig(dp=gpus // (tp * pp * cp), tp=tp, pp=pp, vpp=vp, cp=cp, mbs=mbs, sp=tp > 1,
                            zero=3 if fsdp else 1)
    training = TrainingSpec(gbs=gbs, seq_length=seq, precision=precision, engine="megatron")
    step = gbs * seq / (tokens * gpus)
    case = accuracy.BridgeCase(accuracy.Case(name, "MB", name, load_model(model), training, config,
                                             load_cluster("dgx-h100", gpus), False, step), "26", "H100")
    run = read_log_run(write(tmp_path, name), "dgx-h100", None, None)
    c = run.plan.parallel
    keys = ("dp", "tp", "pp", "vpp", "cp", "sp", "mbs", "zero")
    assert tuple(getattr(c, k) for k in keys) == tuple(getattr(config, k) for k in keys)
    assert run.measured_step_s == pytest.approx(step, rel=3e-3)
    factor = case.case.cluster.primary.hardware.precision_efficiency["fp8"]
    assert run.plan.prediction.step_time_s == pytest.approx(accuracy._bridge_predict(case, factor), rel=1e-9)


# ---- MindFormers ----------------------------------------------------------------------------------------

def mindformers_log(step_ms: int, steps: int = 6, overflow_at: int | None = None) -> str:
    """MFLossMonitor's step lines (mindformers 2.1 core/callback/callback.py)."""
    lines = []
    for step in range(1, steps + 1):
        ms = step_ms * (3 if step == 1 else 1)
        overflow = "True" if step == overflow_at else "False"
        lines.append(f"2026-05-01 10:00:{step:02d},000 - mindformers[mindformers/core/callback/callback.py:748] - INFO - "
                     f"{{ Epoch:[  1/  1], step:[{step:5d}/  100], loss: 8.123456, per_step_time: {ms}ms, lr: 1e-05, "
                     f"overflow cond: {overflow}, loss_scale: 1.0, global_norm: [1.2], train_throughput_per_npu: 90.1T")
    return "\n".join(lines) + "\n"


def test_a_mindformers_log_with_its_yaml_is_a_run(gplan, tmp_path):
    """Llama 2 7B on 16 Ascend 910B (dp 8 × pp 2, vpp 2, MindFormers' YAML as gplan exports it): the YAML
    beside the log gives the configuration, the step lines the step (an overflowed step left out)."""
    plan_path = tmp_path / "plan.json"
    assert gplan("search", "llama2-7b", "--cluster", "atlas-800-910b", "--devices", "16", "--target", "mindformers",
                 "--pp", "2", "--out", str(plan_path)).code == 0
    assert gplan("export", str(plan_path), "--to", "mindformers", "-o", str(tmp_path / "mf")).code == 0
    log = tmp_path / "run.log"
    (tmp_path / "run.yaml").write_text((tmp_path / "mf" / "mindformers_parallel.yaml").read_text())
    log.write_text(mindformers_log(63800, overflow_at=4))
    run = read_log_run(log, "atlas-800-910b", None, None)
    plan = json.loads(plan_path.read_text())
    assert run.measured_step_s == pytest.approx(63.8)
    keys = ("dp", "tp", "pp", "vpp", "mbs", "zero")
    assert {k: getattr(run.plan.parallel, k) for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert run.plan.prediction.step_time_s == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    (tmp_path / "run.yaml").unlink()
    r = gplan("calibrate", str(log), str(log), "--cluster", "atlas-800-910b", "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and "put the run's training YAML beside it" in r.stderr


def test_launcher_prefixes_and_default_markers_are_read_through(tmp_path):
    """torchrun --tee prefixes every line with `[default0]:`; Megatron-DeepSpeed's newer print appends
    `……………default` (or `updated`) to each argument line."""
    args, tokens = ROWS["llama3-70b-row70"]
    text = megatron_log(args, 19.7)
    marked = "\n".join(f"[default0]:{line}" + ("......................default" if " .... " in line else "")
                       for line in text.splitlines())
    path = tmp_path / "tee.log"
    path.write_text(marked + "\n")
    log = read_megatron_log(path)
    assert log.args["tensor_model_parallel_size"] == 4 and log.args["world_size"] == 64
    assert log.args["data_path"] == ["/data/x"] and log.step_s == pytest.approx(19.7, rel=3e-3)


def deepspeed_block(config: dict) -> str:
    """DeepSpeed 0.19's `DeepSpeedConfig.print("DeepSpeedEngine configuration")` (runtime/config.py): a line
    per attribute, dots padding the name to 29, then `  json = ` and the given config as indented JSON —
    each through DeepSpeed's logger, whose prefix is `[date] [INFO] [config.py:line:print]`."""
    prefix = "[2024-03-01 10:00:00,000] [INFO] [config.py:1000:print]"
    attributes = {"train_batch_size": config["train_batch_size"], "zero_enabled": True,
                  "zero_optimization_stage": config["zero_optimization"]["stage"],
                  "train_micro_batch_size_per_gpu": config["train_micro_batch_size_per_gpu"]}
    lines = [f"{prefix} DeepSpeedEngine configuration:"]
    lines += [f"{prefix}   {k} {'.' * (29 - len(k))} {v}" for k, v in sorted(attributes.items())]
    lines.append(f"{prefix}   json = " + json.dumps(config, sort_keys=True, indent=4, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def throughput_line(step: int, max_gb: float) -> str:
    """DeepSpeed's ThroughputTimer line (utils/timer.py, every steps_per_print)."""
    return (f"[2024-03-01 10:{step:02d}:00,000] [INFO] [timer.py:260:stop] epoch=0/micro_step={step * 8}/global_step="
            f"{step}, RunningAvgSamplesPerSec=12.8, CurrSamplesPerSec=12.9, MemAllocated=40.1GB, "
            f"MaxMemAllocated={max_gb}GB\n")


def megatron_deepspeed_args() -> dict:
    args, _ = ROWS["llama3-8b-row250"]
    ds = {k: v for k, v in args.items() if k not in ("group_query_attention", "num_query_groups", "position_embedding_type",
                                                       "rotary_base", "use_distributed_optimizer", "use_megatron_fsdp")}
    return ds | dict(deepspeed=True, zero_stage=1, checkpoint_activations=False, num_key_value_heads=8, fp8=None,
                     use_rotary_position_embeddings=True, rotary_position_embeddings_theta=500000,
                     normalization="rmsnorm", deepspeed_config="ds_config.json")


def test_the_deepspeed_json_in_the_log_decides_the_zero_stage_batch_and_precision(tmp_path):
    """The script passed --zero-stage 1 to the arguments, but the engine ran its JSON's stage 3 and micro
    batch 2: the JSON the DeepSpeedEngine printed is what ran. Its throughput lines give the peak memory."""
    args = megatron_deepspeed_args()
    ds = {"train_batch_size": 128, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
          "zero_optimization": {"stage": 3, "overlap_comm": True}, "bf16": {"enabled": True}}
    log = megatron_log(args, 10.0)
    head, _, rest = log.partition("-------------------- end of arguments ---------------------\n")
    path = tmp_path / "mds.log"
    path.write_text(head + "-------------------- end of arguments ---------------------\n" + deepspeed_block(ds)
                    + rest.replace("[Rank 0] (after 1 iterations)", "[skip]") + throughput_line(10, 61.5))
    logged = read_megatron_log(path)
    assert logged.max_allocated_bytes == 61.5 * 2**30
    run = read_log_run(path, "dgx-h100", None, None)
    c = run.plan.parallel
    assert (c.zero, c.mbs, run.plan.training.gbs, run.plan.training.precision) == (3, 2, 128, "bf16")


def test_a_deepspeed_log_without_megatron_arguments_is_refused_naming_the_model(gplan, tmp_path):
    ds = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
          "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    path = tmp_path / "hf_ds.log"
    path.write_text(deepspeed_block(ds) + "".join(throughput_line(i, 30.0) for i in range(1, 6)))
    r = gplan("calibrate", str(path), "--cluster", "dgx-h100", "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and "DeepSpeed log" in r.stderr and "model" in r.stderr and not (tmp_path / "p.yaml").exists()


def test_a_cut_deepspeed_json_is_refused(tmp_path):
    args = megatron_deepspeed_args()
    block = deepspeed_block({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 1,
                             "zero_optimization": {"stage": 3}})
    log = megatron_log(args, 10.0)
    head, _, _ = log.partition("-------------------- end of arguments ---------------------\n")
    path = tmp_path / "cut.log"
    path.write_text(head + "-------------------- end of arguments ---------------------\n" + block[:-40])
    with pytest.raises(InputError, match="cut short"):
        read_megatron_log(path)
