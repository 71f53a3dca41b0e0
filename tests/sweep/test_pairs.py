"""`sweep.pairs`: paired differences of two sweep points, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvq_jax.sweep import pairs


def test_parse_pairs():
  assert pairs.parse_pairs("a:b, c/d:e") == (("a", "b"), ("c/d", "e"))
  assert pairs.parse_pairs(["a:b"]) == (("a", "b"),)
  assert pairs.parse_pairs(None) == ()
  for bad in ("ab", "a:", ":b", "a:b:c"):
    with pytest.raises(ValueError, match="POINT_A:POINT_B"):
      pairs.parse_pairs(bad)


def test_pair_row_hand_computed():
  """Windows of 2 tokens: A's sums (1, 3, 5), B's (0, 1, 2): differences
  (1, 2, 3), mean 6 / 6 tokens = 1 nat; residuals d - 1 * 2 = (-1, 0, 1),
  var = 3/2 * 2 / 36 = 1/12, stderr 0.2887, z 3.46: A is higher, B lower."""
  sums = {"A": np.array([1.0, 3.0, 5.0]), "B": np.array([0.0, 1.0, 2.0])}
  row = pairs.pair_row(sums, 2, "A", "B")
  assert row["delta_nll_diff"] == pytest.approx(1.0)
  assert row["delta_nll_diff_stderr"] == pytest.approx(math.sqrt(1 / 12))
  assert row["z"] == pytest.approx(1.0 / math.sqrt(1 / 12))
  assert row["verdict"] == "B lower"
  flipped = pairs.pair_row(sums, 2, "B", "A")
  assert flipped["verdict"] == "B lower" and \
      flipped["delta_nll_diff"] == pytest.approx(-1.0)
  # Inside the noise: differences (1, -1, 0.5) around a small mean.
  noisy = {"A": np.array([1.0, -1.0, 0.5]), "B": np.zeros(3)}
  assert pairs.pair_row(noisy, 2, "A", "B")["verdict"] == \
      "no measurable change"
  with pytest.raises(ValueError, match="no point named 'C'"):
    pairs.pair_row(sums, 2, "A", "C")


def test_pairing_removes_shared_window_spread(tmp_path):
  """Two points whose windows differ by a large common offset and a small
  constant gap: the paired stderr is ~0 although each point's own spread is
  large."""
  rng = np.random.default_rng(0)
  common = rng.normal(0, 10, 40)
  sums = {"A": common + 1.0 + rng.normal(0, 0.01, 40), "B": common}
  pairs.save_window_sums(tmp_path / "w.npz", sums, 4)
  back, tokens = pairs.load_window_sums(tmp_path / "w.npz")
  assert tokens == 4 and set(back) == {"A", "B"}
  row = pairs.pair_row(back, tokens, "A", "B")
  assert row["delta_nll_diff"] == pytest.approx(0.25, abs=1e-3)
  assert row["delta_nll_diff_stderr"] < 1e-3 and row["verdict"] == "B lower"
  pairs.write_pairs_csv(tmp_path / "p.csv", [row])
  assert (tmp_path / "p.csv").read_text().splitlines()[1].split(",")[8] == \
      "B lower"
  assert pairs.load_kl_sums(tmp_path / "w.npz") == {}  # None were kept.


def test_kl_is_paired_like_the_nll(tmp_path):
  """KL sums (2, 2, 5) against (1, 1, 1) over windows of 2 tokens: the
  differences (1, 1, 4) have mean 6 / 6 = 1 and residuals (-1, -1, 2):
  var = 3/2 * 6 / 36 = 1/4, stderr 0.5, z 2; written and read back."""
  sums = {"A": np.zeros(3), "B": np.zeros(3)}
  kl = {"A": np.array([2.0, 2.0, 5.0]), "B": np.ones(3)}
  pairs.save_window_sums(tmp_path / "w.npz", sums, 2, kl)
  back = pairs.load_kl_sums(tmp_path / "w.npz")
  np.testing.assert_array_equal(back["A"], kl["A"])
  row = pairs.pair_row(sums, 2, "A", "B", back)
  assert row["kl_diff"] == pytest.approx(1.0)
  assert row["kl_diff_stderr"] == pytest.approx(0.5)
  assert row["kl_z"] == pytest.approx(2.0)
  pairs.write_pairs_csv(tmp_path / "p.csv", [row])
  header, line = (tmp_path / "p.csv").read_text().splitlines()
  assert dict(zip(header.split(","), line.split(",")))["kl_diff"] == "1"
  assert "kl_diff" not in pairs.pair_row(sums, 2, "A", "B")
