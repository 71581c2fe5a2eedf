"""Profile files (`gplan profile`, `gplan calibrate`): a cluster with measured values and provenance."""

from __future__ import annotations

from pathlib import Path

import yaml

from gplan.io import atomic_write_text, read_data_file, validate_as
from gplan.profiles.catalogue import resolve_hardware_names
from gplan.profiles.schema import Profile


def read_profile(path: Path) -> Profile:
    return validate_as(Profile, resolve_hardware_names(read_data_file(path)), str(path))


def write_profile(profile: Profile, path: Path) -> None:
    atomic_write_text(path, yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False))
