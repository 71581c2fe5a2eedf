"""`gplan profile` rejects measurements that cannot be right instead of pricing with them, and a profile
measured at another precision is refused by the commands that price with it."""

from __future__ import annotations

import pytest

from gplan.calibration.profile import implausible
from gplan.profiles.schema import LayerMeasurement


def measurement(mbs: int = 2, forward_s: float = 0.010, backward_s: float | None = 0.020, **kw) -> LayerMeasurement:
    return LayerMeasurement(part="layer", hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=4,
                            ffn_kind="swiglu", vocab_size=1024, seq_length=128, mbs=mbs, tp=1, precision="fp32",
                            forward_s=forward_s, backward_s=backward_s, **kw)


def profile_tiny_llama(measurer, tmp_path, say):
    """Profiles tiny-llama at mbs 1 and 2 with `measurer` standing in for the framework's measuring step."""
    from gplan.calibration import profile as profiling
    from gplan.profiles.catalogue import load_model

    request = profiling.ProfileRequest(model=load_model("tiny-llama"), out=tmp_path / "p.yaml", nproc=1, nnodes=1,
                                       node_rank=0, rdzv_endpoint=None, mbs=[1, 2], tp=[1], seq_length=128,
                                       precision="fp32", max_bytes=None, device="cpu")
    start = profiling.start_profile(tmp_path / "p.yaml", "cpu", 1, 1, "cpu", "torch")
    return profiling.profile_layers(measurer, start, request, "fp32", None, say)


def test_a_plausible_layer_passes():
    assert implausible(measurement(), [measurement(mbs=1, forward_s=0.005)]) is None


@pytest.mark.parametrize("bad, fragment", [
    (measurement(backward_s=0.0), "times must be positive"),
    (measurement(backward_s=0.0001), "backward/forward = 0.01"),
    (measurement(forward_s=0.7, backward_s=1.4), "outside 10× of what the micro-batch ratio allows"),
])
def test_impossible_measurements_are_rejected_with_the_reason(bad, fragment):
    others = [measurement(mbs=1, forward_s=0.005, backward_s=0.010), measurement(mbs=4, forward_s=0.020, backward_s=0.040)]
    assert fragment in implausible(bad, others)


def test_profiling_records_a_rejected_measurement_as_an_error(monkeypatch, tmp_path):
    from gplan.calibration import profile as profiling
    from gplan.profiles.files import read_profile

    class Broken:
        """Measures mbs 2 as impossible every time: measured again twice, then recorded as an error."""
        calls = 0

        def measure_shapes(self, spec, seq, precision, mbs_list, tp_list, device, done, keep):
            Broken.calls += 1
            for m in (measurement(mbs=1, forward_s=0.005, backward_s=0.010), measurement(mbs=2, backward_s=0.0)):
                if profiling.key_of(m) not in done:
                    keep(m)

    messages = []
    profiled = profile_tiny_llama(Broken(), tmp_path, messages.append)
    kept = profiled.node_groups[0].hardware.measured
    assert [m.status for m in kept] == ["ok", "error"] and "times must be positive" in kept[1].note
    assert Broken.calls == 1 + profiling.REMEASURE and any("measuring 1 rejected shape(s) again" in m for m in messages)
    assert any("catalogue's is kept" in m for m in messages)
    assert [m.status for m in read_profile(tmp_path / "p.yaml").node_groups[0].hardware.measured] == ["ok", "error"]


def test_a_profile_of_another_precision_is_refused(gplan, tmp_path):
    from gplan.calibration.profile import start_profile, with_layers
    from gplan.profiles.files import write_profile

    path = tmp_path / "p.yaml"
    write_profile(with_layers(start_profile(path, "cpu", 2, 1, "cpu", "torch"), [measurement(mbs=1)]), path)
    r = gplan("estimate", "tiny-llama", "--profile", str(path), "--devices", "1", "--precision", "bf16")
    assert r.code == 3 and "measured at fp32; this run is bf16" in r.stderr and "--precision fp32" in r.stderr
    assert gplan("estimate", "tiny-llama", "--profile", str(path), "--devices", "1", "--precision", "fp32").code == 0


def test_a_shape_rejected_once_and_measured_well_again_is_kept(tmp_path):
    from gplan.calibration import profile as profiling

    class FirstCallCompiles:
        calls = 0

        def measure_shapes(self, spec, seq, precision, mbs_list, tp_list, device, done, keep):
            FirstCallCompiles.calls += 1
            backward = 0.0 if FirstCallCompiles.calls == 1 else 0.010  # the first call's forward held the compile
            for m in (measurement(mbs=1, forward_s=0.005, backward_s=backward), measurement(mbs=2)):
                if profiling.key_of(m) not in done:
                    keep(m)

    profiled = profile_tiny_llama(FirstCallCompiles(), tmp_path, lambda m: None)
    assert sorted((m.mbs, m.status) for m in profiled.node_groups[0].hardware.measured) == [(1, "ok"), (2, "ok")]
    assert FirstCallCompiles.calls == 2
