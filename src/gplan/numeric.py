"""Small numerical helpers shared by the cost model (interpolating measured shapes) and the
calibration (fitting links and layers): one least-squares line, one minimiser."""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np


class Line(NamedTuple):
    intercept: float
    slope: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(points: list[tuple[float, float]]) -> Line:
    """Ordinary least squares `y = a + b·x` through `points` (two or more, not all at one x)."""
    n = len(points)
    mean_x = sum(p[0] for p in points) / n
    mean_y = sum(p[1] for p in points) / n
    var = sum((p[0] - mean_x) ** 2 for p in points)
    slope = sum((p[0] - mean_x) * (p[1] - mean_y) for p in points) / var if var else 0.0
    return Line(mean_y - slope * mean_x, slope)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iterations: int = 400,
                tolerance: float = 1e-7) -> np.ndarray:
    """Minimise f from x0 (Nelder & Mead 1965, standard coefficients): derivative-free, enough for a
    handful of parameters and a cost model that is not smooth everywhere (max, caps)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) < tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]
