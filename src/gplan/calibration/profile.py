"""`gplan profile`: measure this machine's layers and links and write a profile (a cluster file with
measured values and their provenance).

The measuring is a backend's (`backends/torch/measure.py`, `backends/mindspore/measure.py`); it is
handed in as a `Measurer`, so this module never imports a framework or a backend. Order: the layers
(in this process), then the links (a torchrun or msrun job). The profile file is rewritten after every
measurement, so an interrupted run keeps what it measured and a rerun with the same --out measures only
what is missing. From the layers it fits the device's GEMM efficiency and per-layer launch time
(forward time = a + FLOPs/(peak·gemm)); from the links the intra-node (or, over several nodes,
inter-node) bandwidth and latency of the ring formulas.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from gplan import __version__
from gplan.calibration.apply import apply
from gplan.cost_models.compute import Shard, layer_gemms
from gplan.errors import BackendError, InputError
from gplan.numeric import fit_line
from gplan.profiles.catalogue import clusters_with, hardware_entry
from gplan.profiles.files import read_profile, write_profile
from gplan.profiles.schema import DeviceSpec, LayerMeasurement, LinkFit, LinkMeasurement, Profile, ProfileProvenance
from gplan.profiles.shapes import key_of
from gplan.spec.model import LayerKind, ModelSpec


class Measurer(Protocol):
    """What a backend hands `gplan profile`."""

    framework: str

    def detect(self, device: str) -> tuple[Any, str]:
        """(the device to measure on, its catalogue hardware name)."""

    def measure_shapes(self, spec: ModelSpec, seq_length: int, precision: str, mbs_list: list[int],
                       tp_list: list[int], device: Any, done: set[tuple],
                       on_result: Callable[[LayerMeasurement], None]) -> None: ...

    def link_job(self, out: Path, workdir: Path, nproc: int, nnodes: int, node_rank: int,
                 rdzv_endpoint: str | None, max_bytes: int) -> list[str]:
        """argv of the job that writes the link measurements (JSON list) to `out`."""


@dataclass(frozen=True)
class ProfileRequest:
    model: ModelSpec
    out: Path
    nproc: int
    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None
    mbs: list[int]
    tp: list[int]
    seq_length: int | None
    precision: str | None
    max_bytes: int | None
    device: str


def check_request(request: ProfileRequest) -> None:
    spec = request.model
    if spec.is_moe or spec.is_mla:  # the workers build dense layers with standard attention only
        raise InputError(f"{spec.name}: gplan profile measures dense layers with standard attention; this model has "
                         f"{'routed experts' if spec.is_moe else 'latent attention'}",
                         hint="profile a dense model of the same widths, or estimate from the catalogue")
    bad = [t for t in request.tp if not spec.tp_divides(t)]
    if bad:
        raise InputError(f"--tp {bad[0]} does not divide the heads, kv heads and MLP width of {spec.name}",
                         hint="choose divisors of the kv heads")


def profile_machine(measurer: Measurer, request: ProfileRequest, progress: Callable[[str], None],
                    echo: Callable[[str], None]) -> Profile:
    """Measure the layers, then the links, writing the profile after each measurement."""
    check_request(request)
    device, hardware = measurer.detect(request.device)
    accelerator = hardware != "cpu"
    precision = request.precision or ("bf16" if accelerator else "fp32")
    max_bytes = request.max_bytes or (256 if accelerator else 16) * 2**20
    profile = start_profile(request.out, hardware, request.nproc, request.nnodes, str(device), measurer.framework)
    profile = profile_layers(measurer, profile, request, precision, device, progress)
    write_profile(profile, request.out)
    profile = profile_links(measurer, profile, request, max_bytes, echo)
    write_profile(profile, request.out)
    return profile


def start_profile(path: Path, hardware: str, nproc: int, nnodes: int, device_name: str, framework: str) -> Profile:
    """The profile at `path` when resuming, else a new one on the catalogue's values."""
    from importlib.metadata import PackageNotFoundError, version

    if path.exists():
        return read_profile(path)
    template = clusters_with(hardware)[0]
    group = template.primary.model_copy(update={"nodes": nnodes, "devices_per_node": nproc,
                                                "hardware": DeviceSpec.model_validate(hardware_entry(hardware))})
    provenance = ProfileProvenance(
        host=socket.gethostname(), devices=nproc * nnodes, device_name=device_name, framework=framework,
        framework_version=_version_of(framework, version, PackageNotFoundError), gplan_version=__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=" ".join(sys.argv))
    return Profile(name=f"{socket.gethostname()}-{hardware}-measured", node_groups=[group], provenance=provenance)


def _version_of(framework: str, version, missing) -> str:
    """The measuring framework's version; a measurer that needs no installed framework (a test's) says so."""
    try:
        return version(framework)
    except (missing, StopIteration, ValueError):
        return "not installed"


def with_layers(profile: Profile, measured: list[LayerMeasurement]) -> Profile:
    group = profile.node_groups[0]
    hardware = group.hardware.model_copy(update={"measured": measured})
    return profile.model_copy(update={"node_groups": [group.model_copy(update={"hardware": hardware})]})


def profile_layers(measurer: Measurer, profile: Profile, request: ProfileRequest, precision: str, device: Any,
                   progress: Callable[[str], None]) -> Profile:
    measured = list(profile.node_groups[0].hardware.measured)
    done = {key_of(m) for m in measured}

    def keep(result: LayerMeasurement) -> None:
        nonlocal profile
        why = implausible(result, measured)
        if why:
            result = result.model_copy(update={"status": "error", "note": f"rejected: {why}"})
        measured.append(result)
        profile = with_layers(profile, measured)
        write_profile(profile, request.out)
        progress(f"{result.part} tp={result.tp} mbs={result.mbs}: {result.status}" + (f" ({why})" if why else ""))

    seq = request.seq_length or request.model.seq_length
    for attempt in range(REMEASURE + 1):
        measurer.measure_shapes(request.model, seq, precision, request.mbs, request.tp, device, done, keep)
        rejected = [m for m in measured if m.status == "error" and (m.note or "").startswith("rejected")]
        if not rejected or attempt == REMEASURE:
            break
        progress(f"measuring {len(rejected)} rejected shape(s) again")
        measured[:] = [m for m in measured if m not in rejected]
        done = {key_of(m) for m in measured}
    fitted = fit_efficiency(with_layers(profile, measured), precision)
    if fitted.node_groups[0].hardware.efficiency == profile.node_groups[0].hardware.efficiency:
        progress("too few plausible layer measurements to fit the GEMM efficiency: the catalogue's is kept "
                 "(measured shapes still price themselves)")
    return fitted


REMEASURE = 2
"""How many more times a rejected shape is measured before it is recorded as an error (the first call of
a shape can carry a compilation, and CPU timings swing)."""
BACKWARD_RATIO = (0.25, 20.0)
"""A layer's backward against its forward: a GEMM's backward does twice its forward's FLOPs and flash
attention's 2.5× (Dao 2023); outside 0.25–20× (wide: CPU timings on small shapes swing several-fold) a
measurement is broken — an unsynchronised timer, a cached result — not a property of the layer."""
OUTLIER_FACTOR = 10.0
"""Noise allowed around what other micro-batches of one shape imply: a time between the sibling's
(launch-bound: flat) and the sibling's scaled by the micro-batch ratio (compute-bound: linear), within
this factor either way — a 70× one (a stray recompilation, a preempted device) was seen."""


def implausible(m: LayerMeasurement, others: list[LayerMeasurement]) -> str | None:
    """Why a measurement cannot be right, or None: times must be positive; for layers (GEMM-bound), the
    backward within BACKWARD_RATIO of the forward and the forward within OUTLIER_FACTOR of what the same
    shape at other micro-batches implies."""
    if m.status != "ok":
        return None
    if not m.forward_s or m.forward_s <= 0 or m.backward_s is None or m.backward_s <= 0:
        return f"forward_s {m.forward_s}, backward_s {m.backward_s}: times must be positive"
    if m.part != "layer":
        # the embedding's gather and scatter-add, and a small head, are launch-bound: no ratio to expect
        return None
    low, high = BACKWARD_RATIO
    ratio = m.backward_s / m.forward_s
    if not low <= ratio <= high:
        return f"backward/forward = {ratio:.3g}, outside {low:g}–{high:g}"
    siblings = [o for o in others if o.status == "ok" and o.shape_key() == m.shape_key() and o.mbs != m.mbs
                and o.forward_s]
    for o in siblings:
        ratio = m.mbs / o.mbs
        low, high = o.forward_s * min(1.0, ratio) / OUTLIER_FACTOR, o.forward_s * max(1.0, ratio) * OUTLIER_FACTOR
        if not low <= m.forward_s <= high:
            return (f"forward {m.forward_s:.3g} s at mbs {m.mbs} against {o.forward_s:.3g} s at mbs {o.mbs}: outside "
                    f"{OUTLIER_FACTOR:g}× of what the micro-batch ratio allows")
    return None


def fit_efficiency(profile: Profile, precision: str) -> Profile:
    """GEMM efficiency and launch time per layer from the measured layers: forward = a + F/(P·g)."""
    hardware = profile.node_groups[0].hardware
    points = []
    for m in hardware.measured:
        if m.part != "layer" or m.status != "ok":
            continue
        spec = ModelSpec(name="probe", num_layers=1, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
                         num_kv_heads=m.num_kv_heads, ffn_hidden_size=m.ffn_hidden_size, ffn_kind=m.ffn_kind,
                         vocab_size=m.vocab_size, seq_length=m.seq_length)
        shard = Shard(batch=m.mbs, seq=m.seq_length, kv_seq=m.seq_length, tp=m.tp, sp=False)
        flops = sum(g.flops for g in layer_gemms(spec, LayerKind("decoder", 1, True, False), shard))
        points.append((flops, m.forward_s - (m.attention_forward_s or 0.0)))
    if len(points) < 3:
        return profile
    line = fit_line(points)
    if line.slope <= 0:
        return profile
    gemm = min(1.0, 1.0 / (line.slope * hardware.peak_flops(precision)))
    return apply(profile, {"gemm": gemm, "layer_overhead_s": max(0.0, line.intercept)})


def profile_links(measurer: Measurer, profile: Profile, request: ProfileRequest, max_bytes: int,
                  progress: Callable[[str], None]) -> Profile:
    """Run the link job and fold its fit into the profile's links."""
    if profile.links:
        return profile
    if request.nproc * request.nnodes < 2:
        progress("links: one process, nothing to measure")
        return profile
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "links.json"
        argv = measurer.link_job(result, Path(tmp), request.nproc, request.nnodes, request.node_rank,
                                 request.rdzv_endpoint, max_bytes)
        progress(f"links: {request.nproc * request.nnodes} processes, 4 KiB … {max_bytes / 2**20:g} MiB")
        env = {**os.environ, "NNODES": str(request.nnodes), "OMP_NUM_THREADS": "1",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0 or not result.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise BackendError(f"the link profiler failed (exit {done.returncode}): {tail}",
                               hint="rerun with the same --out to keep the layers measured so far")
        links = [LinkMeasurement.model_validate(d) for d in json.loads(result.read_text())]
    fits = fit_links(links)
    return apply_link_fit(profile.model_copy(update={"links": links, "link_fits": fits}), fits)


def hops(collective: str, ranks: int) -> tuple[float, float]:
    """(latency steps, bytes factor) of the ring formulas: t = steps·α + factor·S/B."""
    if collective == "allreduce":
        return 2 * (ranks - 1), 2 * (ranks - 1) / ranks
    if collective in ("allgather", "reduce_scatter"):
        return ranks - 1, (ranks - 1) / ranks
    return 1, 1.0


def fit_links(measurements: list[LinkMeasurement]) -> list[LinkFit]:
    """Least squares of t = a + b·S per collective and scope, then α = a/steps, B = factor/b."""
    fits = []
    groups: dict[tuple, list[LinkMeasurement]] = {}
    for m in measurements:
        groups.setdefault((m.collective, m.scope, m.ranks), []).append(m)
    for (collective, scope, ranks), points in sorted(groups.items()):
        if len(points) < 2:
            continue
        line = fit_line([(p.size_bytes, p.time_s) for p in points])
        steps, factor = hops(collective, ranks)
        bandwidth = factor / line.slope if line.slope > 0 else float("inf")
        fits.append(LinkFit(collective=collective, scope=scope, latency_us=max(line.intercept, 0.0) / steps * 1e6,
                            bandwidth_GBps=bandwidth / 1e9))
    return fits


def apply_link_fit(profile: Profile, fits: list[LinkFit]) -> Profile:
    """Set the measured link class from the all-reduce fit (bandwidth already effective: efficiency 1)."""
    theta = {}
    for fit in fits:
        if fit.collective == "allreduce":
            theta["intra_node" if fit.scope == "intra" else "inter_node"] = {
                "bandwidth_GBps": fit.bandwidth_GBps, "latency_us": fit.latency_us, "efficiency": 1.0}
    return apply(profile, theta)
