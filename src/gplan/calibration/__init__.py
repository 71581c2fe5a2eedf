"""Fitting the cost model to measurements: one fitter (`numeric.nelder_mead` in log space, with a
prior), one way to apply fitted parameters to a cluster (`apply.apply`), used by `gplan calibrate`
(runs.py), `gplan profile` (profile.py) and `bench/accuracy.py`."""
