"""Whose training log a text is, by each format's own mark."""

from __future__ import annotations


def family(text: str) -> str | None:
    """Whose training log `text` is, by each format's own mark: `megatron` (Megatron-LM's arguments block,
    Megatron-DeepSpeed's too), `torchtitan` (its printed job config, or its step lines), `mindformers`
    (its per-step lines); None for anything else (a launch file, or a log no reader takes)."""
    from gplan.planner.logs import megatron, torchtitan

    if megatron.ARGS_END.search(text):
        return "megatron"
    plain = torchtitan.ANSI.sub("", text)
    if torchtitan.CONFIG_MARK in plain or torchtitan.STEP.search(plain):
        return "torchtitan"
    if "per_step_time:" in text:
        return "mindformers"
    return None
