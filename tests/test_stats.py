"""gp_jax/stats.py: the one place the reports compute means, standard deviations and intervals."""
import math

import numpy as np
import pytest

from gp_jax import stats

# Two-sided 95% critical values of Student's t from printed tables (3 decimals).
TABLE = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 30: 2.042, 60: 2.000, 120: 1.980}


@pytest.mark.parametrize("dof,printed", sorted(TABLE.items()))
def test_t_critical_matches_printed_tables(dof, printed):
  assert abs(stats.t_critical_95(dof) - printed) < 5e-4


def test_t_critical_needs_a_degree_of_freedom():
  with pytest.raises(ValueError):
    stats.t_critical_95(0)


def test_mean_std_and_interval_against_plain_formulas():
  v = [0.2, 0.5, 0.4, 0.1]
  mean, std, n = stats.mean_std(v)
  assert n == 4 and mean == pytest.approx(0.3)
  assert std == pytest.approx(math.sqrt(sum((x - 0.3) ** 2 for x in v) / 3))
  m, half, n = stats.ci95(v)
  assert m == mean and half == pytest.approx(3.182446305 * std / 2, rel=1e-6)
  assert stats.half_width_95(std, 4) == half


def test_small_samples():
  assert stats.mean_std([0.7]) == (0.7, 0.0, 1)
  m, half, n = stats.ci95([0.7])
  assert (m, n) == (0.7, 1) and math.isnan(half)
  m, half, n = stats.ci95([])
  assert n == 0 and math.isnan(m) and math.isnan(half)
  assert math.isnan(stats.half_width_95(0.1, 1))


def test_interval_covers_the_mean_about_95_percent_of_the_time():
  rng = np.random.default_rng(0)
  hits = 0
  for _ in range(4000):
    m, half, _ = stats.ci95(rng.normal(1.0, 2.0, size=5))
    hits += abs(m - 1.0) <= half
  assert 0.94 <= hits / 4000 <= 0.96
