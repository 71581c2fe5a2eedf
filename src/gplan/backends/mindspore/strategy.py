"""The plan as MindSpore semi-auto-parallel strategies: pure data, no MindSpore import, so every
plan shape is checked on any machine.

MindSpore shards an operator by a strategy: for each input, how many parts each dimension is cut
into; the parts multiply to the devices of a pipeline stage (dp·tp here). Megatron's layout, in that
language (activations 2-D, [tokens, hidden]; weights [out, in] as MatMul(transpose_b=True) takes them):

    column-parallel MatMul (q, k, v, MLP up/gate, head)   ((dp, 1), (tp, 1))    weight rows = outputs cut by tp
    row-parallel MatMul (attention out, MLP down)          ((dp, tp), (1, tp))   the contraction dim cut by tp
    attention BatchMatMul / Softmax [b, heads, s, s]       ((dp, tp, 1, 1), …)   heads cut by tp
    embedding Gather (table [vocab, hidden], ids [b, s])   ((tp, 1), (dp, 1))    vocabulary-parallel
    cross-entropy over [tokens, vocab]                     ((dp, tp), (dp, tp))  vocabulary-parallel loss
    norms and residual adds [b, s, hidden]                 ((dp, tp, 1),) with sp, else ((dp, 1, 1),)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gplan.plan import Plan

if TYPE_CHECKING:
    from gplan.backends.protocol import ValidationReport

Strategy = tuple[tuple[int, ...], ...]

COLUMN = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
ROW = ("attention.wo", "feed_forward.w2")


@dataclass(frozen=True)
class ParallelLayout:
    """What the MindSpore worker sets: the auto-parallel context and every operator's strategy."""

    device_num: int
    pipeline_stages: int
    micro_batch_num: int
    dp: int
    tp: int
    sequence_parallel: bool
    optimizer_parallel: bool
    """zero ≥ 1: optimizer state sharded over dp (MindSpore's `enable_parallel_optimizer`)."""
    layer_stage: list[int]
    """Pipeline stage of every decoder layer, in execution order."""
    interleave: bool
    """vpp > 1: MindSpore's interleaved 1F1B; the layers go round the stages in L/(pp·vpp) chunks."""
    layer_recompute: list[str]
    """none / selective / full of every decoder layer."""
    strategies: dict[str, Strategy] = field(default_factory=dict)
    """Operator role -> strategy (the roles of the module docstring)."""

    @property
    def stage_devices(self) -> int:
        return self.device_num // self.pipeline_stages


def layout(plan: Plan) -> ParallelLayout:
    c = plan.parallel
    stages = layer_stages(plan)
    # Each stage's recompute options, taken by its layers in execution order (across its chunks).
    options = [iter([lc.recompute for lc in stage.layers for _ in range(lc.count)]) for stage in plan.stages]
    recompute = [next(options[stage]) for stage in stages]
    return ParallelLayout(device_num=plan.world_size, pipeline_stages=c.pp, micro_batch_num=c.num_microbatches,
                          dp=c.dp, tp=c.tp, sequence_parallel=c.sp and c.tp > 1, optimizer_parallel=c.zero >= 1,
                          layer_stage=stages, interleave=c.vpp > 1, layer_recompute=recompute,
                          strategies=strategies(c.dp, c.tp, c.sp and c.tp > 1))


def layer_stages(plan: Plan) -> list[int]:
    """The stage of every layer: the plan's contiguous split, or with vpp > 1 Megatron's interleaved
    one (virtual stage v·pp + r is chunk v of stage r, each stage's layers over its chunks as
    `chunk_sizes` splits them), which MindSpore's interleaved 1F1B reads off the layers' stages as
    MindFormers sets them (its (pp_interleave_num, pp) offset: engines.mindformers.export.offsets)."""
    from gplan.spec.parallel import chunk_sizes

    c = plan.parallel
    sizes = [stage.layer_end - stage.layer_start for stage in plan.stages]
    if c.vpp == 1:
        return [stage.index for stage, n in zip(plan.stages, sizes) for _ in range(n)]
    chunks = [chunk_sizes(n, c.vpp, first=r == 0, last=r == c.pp - 1) for r, n in enumerate(sizes)]
    return [r for v in range(c.vpp) for r in range(c.pp) for _ in range(chunks[r][v])]


def strategies(dp: int, tp: int, sp: bool) -> dict[str, Strategy]:
    column: Strategy = ((dp, 1), (tp, 1))
    row: Strategy = ((dp, tp), (1, tp))
    elementwise: Strategy = ((dp, tp, 1),) if sp else ((dp, 1, 1),)
    table = {name: column for name in COLUMN} | {name: row for name in ROW}
    table.update({
        "attention.scores": ((dp, tp, 1, 1), (dp, tp, 1, 1)),
        "attention.softmax": ((dp, tp, 1, 1),),
        "attention.context": ((dp, tp, 1, 1), (dp, tp, 1, 1)),
        "embedding": ((tp, 1), (dp, 1)),
        "head": column,
        "loss": ((dp, tp), (dp, tp)),
        "norm": elementwise,
        "residual_add": elementwise + elementwise,
    })
    return table


def device_matrix(role: str, strategy: Strategy) -> list[int]:
    """The devices an operator spreads over, as MindSpore derives them: a MatMul with transposed
    weight ((a, k), (b, k)) uses [a, b, k]; a Gather ((v, 1), (d, 1)) uses [d, v]; every other operator
    (element-wise, softmax, batched matmul over matching inputs) the first input's cuts."""
    if role in COLUMN + ROW + ("head",):
        (a, k), (b, _) = strategy
        return [a, b, k]
    if role == "embedding":
        (v, _), (d, _) = strategy
        return [d, v]
    return list(strategy[0])


REPLICATED_OVER_TP = ("norm", "residual_add")
"""Without sp these run on dp cuts only and repeat over the tp ranks, as Megatron's norms do."""


def check_layout(plan: Plan) -> list[dict]:
    """Every split operator's device matrix must use exactly the devices of a pipeline stage, and an
    element-wise one a divisor of them (it repeats over the rest); what `gplan launch --backend
    mindspore --validate` checks. Raises BackendError otherwise."""
    from gplan.errors import BackendError

    plan_layout = layout(plan)
    rows = []
    for role, strategy in plan_layout.strategies.items():
        matrix = device_matrix(role, strategy)
        used = 1
        for cut in matrix:
            used *= cut
        whole = used == plan_layout.stage_devices
        if not (whole or (role in REPLICATED_OVER_TP and plan_layout.stage_devices % used == 0)):
            raise BackendError(f"operator {role}: strategy {strategy} uses {used} devices, a stage has "
                               f"{plan_layout.stage_devices}", hint="report it: the strategy table is wrong")
        rows.append({"operator": role, "strategy": [list(s) for s in strategy], "device_matrix": matrix})
    return rows


def validation_report(plan: Plan) -> ValidationReport:
    """`check_layout` as the backends' common report: every operator's strategy over a stage's devices."""
    from gplan.backends.protocol import Check, ValidationReport

    devices = plan.world_size // plan.parallel.pp
    checks = [Check(f"operator {row['operator']}: strategy {tuple(map(tuple, row['strategy']))}",
                    f"device matrix {row['device_matrix']}", f"{devices} devices per stage")
              for row in check_layout(plan)]
    return ValidationReport("mindspore", f"every operator over the {devices} devices of a stage "
                                         f"({plan.parallel.pp} stages)", checks)


def optimizer_parallel_note(zero: int) -> str | None:
    """MindSpore's optimizer parallel keeps weights as dp slices too: zero 1 and 2 run as zero 3."""
    if zero not in (1, 2):
        return None
    return (f"MindSpore's optimizer parallel also keeps the weights as data-parallel slices and gathers them "
            f"before use (as zero 3 does): less memory than zero {zero} was priced with, one more weight "
            f"all-gather per step")
