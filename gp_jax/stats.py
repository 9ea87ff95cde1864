"""Summary statistics over seeds: the one place the reports compute them.

  mean_std(values)   -> (mean, sample std (ddof=1; 0 for one value), n)
  ci95(values)       -> (mean, half-width of the two-sided 95% Student-t interval of the mean, n);
                        the half-width is NaN below two values
  half_width_95(std, n): the same half-width from a sample std and a count
  t_critical_95(dof) : the two-sided 95% critical value of Student's t (exact, scipy)

The sweep report's paired gaps, the studies report (mean ± std) and the drift report (intervals
of means, differences and recoveries) all read these.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats


def mean_std(values) -> tuple[float, float, int]:
  """(mean, sample standard deviation (ddof=1; 0.0 for a single value), n)."""
  v = np.asarray(values, float)
  if not len(v):
    return math.nan, math.nan, 0
  return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def t_critical_95(dof: int) -> float:
  """Two-sided 95% critical value of Student's t with `dof` degrees of freedom (>= 1)."""
  if dof < 1:
    raise ValueError(f"need at least 1 degree of freedom, got {dof}")
  return float(scipy_stats.t.ppf(0.975, dof))


def half_width_95(std: float, n: int) -> float:
  """Half-width of the 95% t-interval of a mean of n values with sample std `std`; NaN for n < 2."""
  if n < 2:
    return math.nan
  return t_critical_95(n - 1) * std / math.sqrt(n)


def ci95(values) -> tuple[float, float, int]:
  """(mean, half-width of the 95% t-interval, n); the half-width is NaN for n < 2."""
  mean, std, n = mean_std(values)
  return mean, half_width_95(std, n), n
