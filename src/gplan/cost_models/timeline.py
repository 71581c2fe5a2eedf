"""The pipeline schedule played out op by op: when each stage runs which forward and backward.

`cost_models.pipeline` prices a schedule with a closed formula; this module simulates it, for the
picture `gplan explain` draws and as a check of the formula. Every stage runs its ops in the order its
schedule fixes; an op starts when its stage is free and its input has arrived:

    F(b, s)  after F(b, s − 1)                        (virtual stage s, micro-batch b)
    B(b, s)  after B(b, s + 1); the last virtual stage's B(b) after its own F(b)

Orders per rank r of p, with m micro-batches and v chunks (virtual stage c·p + r holds chunk c):
    gpipe              F0 … F(m−1), then B0 … B(m−1)                        (Huang et al. 2019)
    1f1b               min(p − r − 1, m) forwards, then one forward one backward, then the rest
                       of the backwards                                      (Narayanan et al. 2021)
    interleaved_1f1b   warm-up of min(2·(p − r − 1) + (v − 1)·p, m·v) forwards, then 1F1B over
                       model chunks; forward step k runs chunk ⌊(k mod p·v)/p⌋ of micro-batch
                       ⌊k/(p·v)⌋·p + k mod p, backward step k the chunks in reverse  (Megatron-LM)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    stage: int
    kind: str
    """`F` or `B`."""
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


def rank_order(rank: int, pp: int, num_microbatches: int, schedule: str, vpp: int = 1) -> list[tuple[str, int, int]]:
    """(kind, micro-batch, chunk) in the order rank `rank` runs them."""
    m = num_microbatches
    if schedule == "gpipe":
        return [("F", b, 0) for b in range(m)] + [("B", b, 0) for b in range(m)]
    if schedule == "1f1b":
        warmup = min(pp - rank - 1, m)
        forwards = [("F", b, 0) for b in range(m)]
        backwards = [("B", b, 0) for b in range(m)]
        return _one_forward_one_backward(forwards, backwards, warmup)
    total = m * vpp
    forwards = [("F", *_interleaved_step(k, pp, vpp, backward=False)) for k in range(total)]
    backwards = [("B", *_interleaved_step(k, pp, vpp, backward=True)) for k in range(total)]
    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
    return _one_forward_one_backward(forwards, backwards, warmup)


def _interleaved_step(k: int, pp: int, vpp: int, backward: bool) -> tuple[int, int]:
    chunk = (k % (pp * vpp)) // pp
    if backward:
        chunk = vpp - 1 - chunk
    return (k // (pp * vpp)) * pp + k % pp, chunk


def _one_forward_one_backward(forwards: list, backwards: list, warmup: int) -> list:
    order = forwards[:warmup]
    for j, forward in enumerate(forwards[warmup:]):
        order += [forward, backwards[j]]
    return order + backwards[len(forwards) - warmup:]


def simulate(forward_s: list[float], backward_s: list[float], num_microbatches: int, schedule: str,
             vpp: int = 1, send_s: float = 0.0) -> list[Op]:
    """Every op's start and end. `forward_s[i]`/`backward_s[i]`: stage i's time for one micro-batch
    (all its chunks); `send_s`: the hop between stages."""
    pp = len(forward_s)
    orders = [rank_order(r, pp, num_microbatches, schedule, vpp) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * pp
    cursor = [0] * pp
    ops: list[Op] = []
    last = pp * vpp - 1
    while any(cursor[r] < len(orders[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while cursor[r] < len(orders[r]):
                kind, b, chunk = orders[r][cursor[r]]
                virtual = chunk * pp + r
                ready = _ready_s(done, kind, b, virtual, last, send_s)
                if ready is None:
                    break
                start = max(free[r], ready)
                end = start + (forward_s[r] if kind == "F" else backward_s[r]) / vpp
                done[kind, b, virtual] = end
                free[r] = end
                ops.append(Op(r, kind, b, chunk, start, end))
                cursor[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} deadlocks for pp={pp} m={num_microbatches} vpp={vpp}")
    return ops


def _ready_s(done: dict, kind: str, b: int, virtual: int, last: int, send_s: float) -> float | None:
    """When the input of op (kind, b, virtual) is available; None while it is not yet computed."""
    if kind == "F":
        if virtual == 0:
            return 0.0
        end = done.get(("F", b, virtual - 1))
        return None if end is None else end + send_s
    if virtual == last:
        return done.get(("F", b, virtual))
    end = done.get(("B", b, virtual + 1))
    return None if end is None else end + send_s


def makespan_s(ops: list[Op]) -> float:
    return max(op.end_s for op in ops)


def shown_microbatches(pp: int, num_microbatches: int) -> int:
    """Enough micro-batches to show warm-up, steady state and cool-down (a multiple of pp, as the
    interleaved schedule needs); the steady state of a longer run only repeats."""
    return min(num_microbatches, pp * max(2, -(-8 // pp)))


def stage_split_s(forward_s: float, backward_s: float, time_s: float) -> tuple[float, float]:
    """A stage's T_i split into forward and backward parts, communication shared in proportion."""
    forward = time_s * forward_s / (forward_s + backward_s)
    return forward, time_s - forward
