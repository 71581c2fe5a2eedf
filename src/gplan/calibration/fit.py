"""The one fitter: parameters that are positive and spread over orders of magnitude (efficiencies,
overheads in seconds) are fitted in log space,

    minimise  misfit(θ) + λ · Σ_k (log θ_k − log θ₀_k)²

with Nelder–Mead restarted from its best point (a fresh simplex escapes a collapsed one). The prior
λ keeps a parameter the data cannot tell apart where it started."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gplan.numeric import nelder_mead

RESTARTS = 3


def fit_log(misfit: Callable[[dict[str, float]], float], start: dict[str, float], prior_weight: float,
            step: float = 0.5) -> dict[str, float]:
    names = list(start)
    base = np.log([start[k] for k in names])

    def loss(x: np.ndarray) -> float:
        return misfit(dict(zip(names, map(float, np.exp(x))))) + prior_weight * float(np.sum((x - base) ** 2))

    best = base
    for _ in range(RESTARTS):
        best = nelder_mead(loss, best, step=step)
    return dict(zip(names, map(float, np.exp(best))))
