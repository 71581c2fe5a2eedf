"""The shapes and message sizes a profile measures, in order, shared by the torch and MindSpore
measurers (no framework import here)."""

from __future__ import annotations

from typing import Callable, Iterator

from gplan.profiles.schema import LayerMeasurement
from gplan.spec.model import ModelSpec

PARTS = ("layer", "head", "embedding")
MIN_LINK_BYTES = 4 * 1024


def link_sizes(max_bytes: int) -> list[int]:
    """Message sizes the link measurers time: 4 KiB up to `max_bytes` in steps of 4×."""
    out, size = [], MIN_LINK_BYTES
    while size <= max_bytes:
        out.append(size)
        size *= 4
    return out


def key_of(m: LayerMeasurement) -> tuple:
    return m.shape_key() + (m.mbs,)


def base(spec: ModelSpec, seq_length: int, precision: str, part: str, tp: int, mbs: int) -> LayerMeasurement:
    """A measurement with its shape filled in and no times yet."""
    return LayerMeasurement(part=part, hidden_size=spec.hidden_size, ffn_hidden_size=spec.ffn_size,
                            num_attention_heads=spec.num_attention_heads, num_kv_heads=spec.kv_heads,
                            ffn_kind=spec.ffn_kind, vocab_size=spec.vocab_size, seq_length=seq_length, mbs=mbs,
                            tp=tp, precision=precision)


def pending(spec: ModelSpec, seq_length: int, precision: str, mbs_list: list[int], tp_list: list[int],
            done: set[tuple] | None) -> Iterator[LayerMeasurement]:
    """Every (tp, mbs, part) not yet in `done` (keys of `key_of`)."""
    for tp in tp_list:
        for mbs in mbs_list:
            for part in PARTS:
                shape = base(spec, seq_length, precision, part, tp, mbs)
                if not (done and key_of(shape) in done):
                    yield shape


def measure_all(shapes: Iterator[LayerMeasurement], measure: Callable[[LayerMeasurement], LayerMeasurement],
                on_result: Callable[[LayerMeasurement], None] | None) -> list[LayerMeasurement]:
    """Measure each shape, reporting it through `on_result` as soon as it is done, so an interrupted
    run keeps what it has."""
    results = []
    for shape in shapes:
        result = measure(shape)
        results.append(result)
        if on_result:
            on_result(result)
    return results
