"""Fixtures of the backend tests (the plans themselves are in tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TINY_LLAMA, tiny_plan

from gplan.spec.model import ModelSpec


@pytest.fixture
def plan_factory(tmp_path):
    counter = iter(range(1000))

    def make(model: ModelSpec = TINY_LLAMA, stages=None, **degrees) -> Path:
        return tiny_plan(tmp_path / f"plan{next(counter)}.json", model, stages, **degrees)

    return make
