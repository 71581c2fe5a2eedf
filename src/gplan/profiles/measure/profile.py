"""`gplan profile`: measure this machine's layers and links and write a profile (a cluster file with
measured values and their provenance).

Order: the layers (in this process), then the links (a torchrun job of --nproc processes). The
profile file is rewritten after every measurement, so an interrupted run keeps what it measured and
a rerun with the same --out measures only what is missing. From the layers it fits the device's
GEMM efficiency and per-layer launch time (forward time = a + FLOPs/(peak·gemm)); from the links the
intra-node (or, over several nodes, inter-node) bandwidth and latency.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import yaml

from gplan import __version__
from gplan.errors import BackendError
from gplan.profiles.catalogue import hardware_entry, load_cluster
from gplan.profiles.measure.links import fit_links
from gplan.profiles.schema import (
    DeviceSpec,
    LayerMeasurement,
    LinkFit,
    LinkMeasurement,
    Profile,
    ProfileProvenance,
)
from gplan.spec.model import ModelSpec


def read_profile(path: Path) -> Profile:
    from gplan.spec.loaders import load_yaml_file, validate_as

    return validate_as(Profile, load_yaml_file(path), str(path))


def write_profile(profile: Profile, path: Path) -> None:
    text = yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def detect_device(device: str, backend: str = "torch"):
    """(device, catalogue hardware name) of this machine: a torch device, or MindSpore's target."""
    if backend == "mindspore":
        from gplan.profiles.measure.layers_mindspore import set_device

        target = set_device(device)
        return target, "ascend-910b" if target == "Ascend" else "cpu"
    import torch

    if device in ("auto", "cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower()
        for key, entry in (("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80g"), ("v100", "v100-32g")):
            if key in name:
                return torch.device("cuda", 0), entry
        return torch.device("cuda", 0), "h100-sxm"
    return torch.device("cpu"), "cpu"


def start_profile(path: Path, hardware: str, nproc: int, nnodes: int, device_name: str,
                  backend: str = "torch") -> Profile:
    """The profile at `path` when resuming, else a new one on the catalogue's values."""
    from importlib.metadata import version

    if path.exists():
        return read_profile(path)
    entry = hardware_entry(hardware)
    template = next(c for c in _clusters_with(hardware))
    group = template.primary.model_copy(update={"nodes": nnodes, "devices_per_node": nproc,
                                                "hardware": DeviceSpec.model_validate(entry)})
    provenance = ProfileProvenance(
        host=socket.gethostname(), devices=nproc * nnodes, device_name=device_name, framework=backend,
        framework_version=version(backend), gplan_version=__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=" ".join(sys.argv))
    return Profile(name=f"{socket.gethostname()}-{hardware}-measured", node_groups=[group], provenance=provenance)


def _clusters_with(hardware: str):
    from gplan.profiles.catalogue import bundled_clusters

    for name, table in bundled_clusters().items():
        if table["node_groups"][0]["hardware"] == hardware:
            yield load_cluster(name)


def with_layers(profile: Profile, measured: list[LayerMeasurement]) -> Profile:
    group = profile.node_groups[0]
    hardware = group.hardware.model_copy(update={"measured": measured})
    return profile.model_copy(update={"node_groups": [group.model_copy(update={"hardware": hardware})]})


def profile_layers(profile: Profile, out: Path, spec: ModelSpec, seq_length: int, precision: str,
                   mbs_list: list[int], tp_list: list[int], device, progress: Callable[[str], None],
                   backend: str = "torch") -> Profile:
    from gplan.profiles.measure.shapes import key_of

    measured = list(profile.node_groups[0].hardware.measured)
    done = {key_of(m) for m in measured}

    def keep(result: LayerMeasurement) -> None:
        nonlocal profile
        measured.append(result)
        profile = with_layers(profile, measured)
        write_profile(profile, out)
        progress(f"{result.part} tp={result.tp} mbs={result.mbs}: {result.status}")

    if backend == "mindspore":
        from gplan.profiles.measure.layers_mindspore import measure_shapes as measure_mindspore

        measure_mindspore(spec, seq_length, precision, mbs_list, tp_list, done=done, on_result=keep)
    else:
        from gplan.profiles.measure.layers import measure_shapes

        measure_shapes(spec, seq_length, precision, mbs_list, tp_list, device, done=done, on_result=keep)
    return fit_efficiency(with_layers(profile, measured), precision)


def fit_efficiency(profile: Profile, precision: str) -> Profile:
    """GEMM efficiency and launch time per layer from the measured layers: forward = a + F/(P·g)."""
    from gplan.cost_models.compute import Shard, layer_gemms
    from gplan.spec.model import LayerKind

    group = profile.node_groups[0]
    hardware = group.hardware
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
    n = len(points)
    mean_f = sum(p[0] for p in points) / n
    mean_t = sum(p[1] for p in points) / n
    var = sum((p[0] - mean_f) ** 2 for p in points)
    slope = sum((p[0] - mean_f) * (p[1] - mean_t) for p in points) / var if var else 0.0
    if slope <= 0:
        return profile
    gemm = min(1.0, 1.0 / (slope * hardware.peak_flops(precision)))
    launch = max(0.0, mean_t - slope * mean_f)
    efficiency = hardware.efficiency.model_copy(update={"gemm": gemm, "layer_overhead_s": launch})
    hardware = hardware.model_copy(update={"efficiency": efficiency})
    return profile.model_copy(update={"node_groups": [group.model_copy(update={"hardware": hardware})]})


def profile_links(profile: Profile, out: Path, nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None,
                  max_bytes: int, progress: Callable[[str], None], backend: str = "torch") -> Profile:
    """Run the link job (torchrun, or msrun for MindSpore) and fold its fit into the profile's links."""
    if profile.links:
        return profile
    if nproc * nnodes < 2:
        progress("links: one process, nothing to measure")
        return profile
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "links.json"
        if backend == "mindspore":
            argv = _msrun_links(result, tmp, nproc, nnodes, node_rank, rdzv_endpoint, max_bytes)
        else:
            head = ["--standalone"] if nnodes == 1 else ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                                                         "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint or ""]
            argv = [sys.executable, "-m", "torch.distributed.run", *head, "--nproc-per-node", str(nproc),
                    "-m", "gplan.profiles.measure.links", "--out", str(result), "--max-bytes", str(max_bytes)]
        progress(f"links: {nproc * nnodes} processes, 4 KiB … {max_bytes / 2**20:g} MiB")
        env = {**os.environ, "NNODES": str(nnodes), "OMP_NUM_THREADS": "1",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0 or not result.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise BackendError(f"the link profiler failed (exit {done.returncode}): {tail}",
                               hint="rerun with the same --out to keep the layers measured so far")
        links = [LinkMeasurement.model_validate(d) for d in json.loads(result.read_text())]
    fits = fit_links(links)
    profile = apply_link_fit(profile.model_copy(update={"links": links, "link_fits": fits}), fits)
    write_profile(profile, out)
    return profile


def _msrun_links(result: Path, tmp: str, nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None,
                 max_bytes: int) -> list[str]:
    import importlib.util

    script = importlib.util.find_spec("gplan.profiles.measure.links_mindspore").origin
    host, _, port = (rdzv_endpoint or "127.0.0.1:8118").rpartition(":")
    return [str(Path(sys.executable).with_name("msrun")), f"--worker_num={nproc * nnodes}", f"--local_worker_num={nproc}",
            f"--master_addr={host}", f"--master_port={port}", f"--node_rank={node_rank}", f"--log_dir={tmp}/msrun_log",
            "--join=True", script, "--out", str(result), "--max-bytes", str(max_bytes),
            "--scope", "inter" if nnodes > 1 else "intra"]


def apply_link_fit(profile: Profile, fits: list[LinkFit]) -> Profile:
    """Set the measured link class from the all-reduce fit (bandwidth already effective: efficiency 1)."""
    group = profile.node_groups[0]
    update = {}
    for fit in fits:
        if fit.collective != "allreduce":
            continue
        name = "intra_node" if fit.scope == "intra" else "inter_node"
        update[name] = getattr(group, name).model_copy(update={
            "bandwidth_GBps": fit.bandwidth_GBps, "latency_us": fit.latency_us, "efficiency": 1.0})
    return profile.model_copy(update={"node_groups": [group.model_copy(update=update)]})


def machine_name() -> str:
    return f"{socket.gethostname()} ({platform.machine()})"
