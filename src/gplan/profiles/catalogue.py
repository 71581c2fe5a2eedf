"""The bundled catalogues (hardware, clusters, models) and the loaders that resolve a bundled name or
a file into a validated spec. Every number in `data/*.yaml` carries its source there."""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from gplan.errors import InputError
from gplan.io import load_yaml, read_data_file, validate_as
from gplan.profiles.schema import ClusterSpec
from gplan.spec.loaders import load_model_file
from gplan.spec.model import ModelSpec


@cache
def _data(name: str) -> dict[str, Any]:
    text = resources.files("gplan.profiles").joinpath("data", name).read_text()
    return load_yaml(text)


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


def resolve_hardware_names(data: Any) -> Any:
    """A cluster mapping with every `hardware: NAME` replaced by the bundled description."""
    if not isinstance(data, dict) or not isinstance(data.get("node_groups"), list):
        return data
    groups = [{**g, "hardware": hardware_entry(g["hardware"])} if isinstance(g, dict) and isinstance(g.get("hardware"), str)
              else g for g in data["node_groups"]]
    return {**data, "node_groups": groups}


def cluster_from_data(data: Any, source: str) -> ClusterSpec:
    return validate_as(ClusterSpec, resolve_hardware_names(data), source)


def load_cluster(ref: str, devices: int | None = None) -> ClusterSpec:
    """A ClusterSpec from a bundled name or a cluster.yaml; bundled templates are sized to `devices`."""
    table = bundled_clusters()
    if ref in table:
        cluster = cluster_from_data({"name": ref, **table[ref]}, f"bundled cluster {ref}")
        return cluster.sized(devices) if devices else cluster
    path = Path(ref)
    if path.suffix not in (".yaml", ".yml", ".json") and not path.exists():
        raise _unknown("cluster", ref, list(table), "hardware")
    data = read_data_file(path)
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    return cluster_from_data(data, str(path))


def cluster_from_hardware(hardware: str, devices: int, devices_per_node: int | None = None) -> ClusterSpec:
    """A one-group cluster of `hardware` (a bundled name, or a hardware file: `hardware_variant`), with the
    links of the bundled cluster that uses it (or its base), unless the file gives its own."""
    entry, links, base = hardware_variant(Path(hardware)) if is_hardware_file(hardware) else \
        (hardware_entry(hardware), {}, hardware)
    template = next((c for c in bundled_clusters().values()
                     if c["node_groups"][0]["hardware"] == base), None)
    if template is None and not {"devices_per_node", "intra_node", "inter_node"} <= links.keys():
        raise InputError(f"no bundled links for hardware '{base or hardware}'",
                         hint="give devices_per_node, intra_node and inter_node in the hardware file, or a base: "
                              "a bundled hardware whose cluster has the links")
    group = {**(template["node_groups"][0] if template else {}), **links}
    group["hardware"] = entry
    if devices_per_node:
        group["devices_per_node"] = devices_per_node
    cluster = validate_as(ClusterSpec, {"name": f"{entry['name']}-x{devices}", "node_groups": [group]},
                          f"--hardware {hardware}")
    return cluster.sized(devices)


VARIANT_LINKS = ("devices_per_node", "intra_node", "inter_node")
"""Keys of a hardware file that set the node and its links rather than the device."""


def is_hardware_file(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) or Path(ref).is_file()


def hardware_variant(path: Path) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """Your own device (`--hardware FILE.yaml`): a `base:` bundled hardware with the numbers the file changes
    (memory_GiB, peak_tflops.bf16, hbm_bandwidth_GBps, efficiency.…; nested keys merge), or a whole
    description without one; `devices_per_node`, `intra_node`, `inter_node` set its node and links.
    Returns (device entry, link overrides, base name)."""
    if not path.is_file():
        raise InputError(f"--hardware {path}: no such file", hint="a bundled name (gplan hardware) or a hardware.yaml")
    data = read_data_file(path)
    if not isinstance(data, dict):
        raise InputError(f"--hardware {path}: expected a mapping of device fields", hint="see README, 'Your own hardware'")
    base = data.get("base")
    device = {k: v for k, v in data.items() if k not in ("base", *VARIANT_LINKS)}
    entry = _merged(hardware_entry(base), device) if base else device
    entry["name"] = str(data.get("name") or path.stem)
    return entry, {k: data[k] for k in VARIANT_LINKS if k in data}, base


def hardware_changes(ref: str) -> str:
    """What a hardware file changes from its base, as said in the search header ('' for a bundled name)."""
    if not is_hardware_file(ref):
        return ""
    entry, links, base = hardware_variant(Path(ref))
    if not base:
        return f"hardware {entry['name']} from {ref} (its own description)"
    changed = [f"{key} {old} → {new}" for key, old, new in _differences(hardware_entry(base), entry) if key != "name"]
    changed += [f"{key} {value}" for key, value in links.items()]
    return f"hardware {entry['name']} from {ref}: {base} with " + (", ".join(changed) or "nothing changed")


def _merged(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def _differences(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    found = []
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            found += _differences(before, value, f"{prefix}{key}.")
        elif value != before:
            found.append((f"{prefix}{key}", before, value))
    return found


def clusters_with(hardware: str) -> list[ClusterSpec]:
    """The bundled clusters whose nodes are `hardware` devices."""
    return [load_cluster(name) for name, table in bundled_clusters().items()
            if table["node_groups"][0]["hardware"] == hardware]


def load_model(ref: str | ModelSpec) -> ModelSpec:
    """A model from a bundled name, a model.yaml, or an HF config.json (file or its folder); a ModelSpec
    already read (a launch's own model) as it is."""
    if isinstance(ref, ModelSpec):
        return ref
    models = bundled_models()
    if ref in models:
        return validate_as(ModelSpec, {"name": ref, **models[ref]}, f"bundled model {ref}")
    path = Path(ref)
    if not path.exists() and path.suffix not in (".yaml", ".yml", ".json"):
        close = difflib.get_close_matches(ref, list(models), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "list them with: gplan models"
        raise InputError(f"unknown model '{ref}': neither a bundled name nor a file", hint=hint)
    return load_model_file(path)
