"""The bundled catalogues (hardware, clusters, models) and cluster loading."""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gplan.errors import InputError


@cache
def _data(name: str) -> dict[str, Any]:
    text = resources.files("gplan.profiles").joinpath("data", name).read_text()
    return yaml.safe_load(text)


def bundled_hardware() -> dict[str, Any]:
    return _data("hardware.yaml")


def bundled_clusters() -> dict[str, Any]:
    return _data("clusters.yaml")


def bundled_models() -> dict[str, Any]:
    return _data("models.yaml")


def _unknown(kind: str, name: str, known: list[str], command: str) -> InputError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"list them with: gplan {command}"
    return InputError(f"unknown {kind} '{name}'", hint=hint)


def hardware_entry(name: str) -> dict[str, Any]:
    """A bundled device description (raw, validated by DeviceSpec)."""
    table = bundled_hardware()
    if name not in table:
        raise _unknown("hardware", name, list(table), "hardware")
    return {"name": name, **table[name]}


def load_cluster(ref: str, devices: int | None = None):
    """A ClusterSpec from a bundled name or a cluster.yaml; bundled templates are sized to `devices`."""
    from gplan.profiles.schema import ClusterSpec
    from gplan.spec.loaders import load_yaml_file, validate_as

    table = bundled_clusters()
    if ref in table:
        cluster = validate_as(ClusterSpec, {"name": ref, **table[ref]}, f"bundled cluster {ref}")
        return cluster.sized(devices) if devices else cluster
    path = Path(ref)
    if path.suffix not in (".yaml", ".yml", ".json") and not path.exists():
        raise _unknown("cluster", ref, list(table), "hardware")
    data = load_yaml_file(path)
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    return validate_as(ClusterSpec, data, str(path))


def cluster_from_hardware(hardware: str, devices: int, devices_per_node: int | None = None):
    """A one-group cluster of `hardware`, with the links of the bundled cluster that uses it."""
    from gplan.profiles.schema import ClusterSpec

    entry = hardware_entry(hardware)
    template = next((c for c in bundled_clusters().values()
                     if c["node_groups"][0]["hardware"] == hardware), None)
    if template is None:
        raise InputError(f"no bundled links for hardware '{hardware}'",
                         hint="write a cluster.yaml with intra_node and inter_node links")
    group = dict(template["node_groups"][0])
    group["hardware"] = entry
    if devices_per_node:
        group["devices_per_node"] = devices_per_node
    cluster = ClusterSpec.model_validate({"name": f"{hardware}-x{devices}", "node_groups": [group]})
    return cluster.sized(devices)
