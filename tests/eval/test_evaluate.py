"""evaluate_windows with fake (numpy) forward functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvq_jax.eval.evaluate import evaluate_many, evaluate_windows
from kvq_jax.eval.windows import scored_mask

W, T, V = 5, 6, 7
RNG = np.random.default_rng(0)
WINDOWS = RNG.integers(0, V, size=(W, T)).astype(np.int32)
TABLE_BASE = RNG.standard_normal((V, V)).astype(np.float32)
TABLE_QUANT = TABLE_BASE + 0.3 * RNG.standard_normal((V, V)).astype(np.float32)


def table_forward(table, calls=None):
  """logits[b, t] = table[tokens[b, t]]: a bigram 'model'."""
  def forward(tokens_BxT):
    if calls is not None:
      calls.append(np.asarray(tokens_BxT).shape[0])
    return table[np.asarray(tokens_BxT)]
  return forward


def log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def expected(table_b, table_q, mask):
  logp_b = log_softmax(table_b[WINDOWS[:, :-1]].astype(np.float64))
  logp_q = log_softmax(table_q[WINDOWS[:, :-1]].astype(np.float64))
  tgt = WINDOWS[:, 1:, None]
  nll_b = -np.take_along_axis(logp_b, tgt, -1)[..., 0][:, mask]
  nll_q = -np.take_along_axis(logp_q, tgt, -1)[..., 0][:, mask]
  kl = (np.exp(logp_b) * (logp_b - logp_q)).sum(-1)[:, mask]
  top1 = (logp_b.argmax(-1) == logp_q.argmax(-1))[:, mask]
  return nll_b, nll_q, kl, top1


@pytest.mark.parametrize("batch_size", [1, 2, 5, 8])
def test_metrics_match_numpy_for_any_batch_size(batch_size):
  mask = scored_mask(T, "second_half")
  calls, progress = [], []
  result = evaluate_windows(
      WINDOWS, mask, table_forward(TABLE_BASE, calls),
      table_forward(TABLE_QUANT), batch_size=batch_size,
      progress=lambda done, total: progress.append((done, total)))
  nll_b, nll_q, kl, top1 = expected(TABLE_BASE, TABLE_QUANT, mask)
  metrics = result.metrics()
  assert set(metrics) == {
      "ppl_baseline", "ppl_baseline_stderr", "ppl_quant", "ppl_quant_stderr",
      "delta_ppl", "kl_mean", "top1_agreement", "num_windows", "window_len",
      "num_scored_tokens"}
  assert metrics["num_windows"] == W and metrics["window_len"] == T
  assert metrics["num_scored_tokens"] == W * (T - 1 - T // 2) == nll_b.size
  assert metrics["ppl_baseline"] == pytest.approx(math.exp(nll_b.mean()),
                                                  rel=1e-5)
  assert metrics["ppl_quant"] == pytest.approx(math.exp(nll_q.mean()), rel=1e-5)
  assert metrics["delta_ppl"] == pytest.approx(
      math.exp(nll_q.mean()) - math.exp(nll_b.mean()), rel=1e-4, abs=1e-6)
  assert metrics["ppl_baseline_stderr"] == pytest.approx(
      math.exp(nll_b.mean()) * math.sqrt(nll_b.var() / (nll_b.size - 1)),
      rel=1e-4)
  assert metrics["kl_mean"] == pytest.approx(kl.mean(), rel=1e-4)
  assert metrics["top1_agreement"] == pytest.approx(top1.mean())
  # Every window is seen once, in batches of batch_size (the last smaller).
  assert sum(calls) == W and max(calls) == min(batch_size, W)
  assert progress[-1] == (W, W) and len(progress) == math.ceil(W / batch_size)


def test_baseline_only_has_no_quant_keys():
  mask = scored_mask(T, "all")
  result = evaluate_windows(WINDOWS, mask, table_forward(TABLE_BASE),
                            batch_size=2)
  nll_b, _, _, _ = expected(TABLE_BASE, TABLE_BASE, mask)
  assert result.quant is None and result.kl_mean is None
  metrics = result.metrics()
  assert set(metrics) == {"ppl_baseline", "ppl_baseline_stderr",
                          "num_windows", "window_len", "num_scored_tokens"}
  assert metrics["num_scored_tokens"] == W * (T - 1)
  assert metrics["ppl_baseline"] == pytest.approx(math.exp(nll_b.mean()),
                                                  rel=1e-5)


def test_identical_quant_gives_zero_delta_and_kl():
  metrics = evaluate_windows(
      WINDOWS, scored_mask(T, "all"), table_forward(TABLE_BASE),
      table_forward(TABLE_BASE), batch_size=3).metrics()
  assert metrics["delta_ppl"] == 0.0
  assert abs(metrics["kl_mean"]) < 1e-6
  assert metrics["top1_agreement"] == 1.0


def test_evaluate_many_shares_the_baseline_pass():
  mask = scored_mask(T, "second_half")
  calls = []
  results = evaluate_many(
      WINDOWS, mask, table_forward(TABLE_BASE, calls),
      {"a": table_forward(TABLE_QUANT), "same": table_forward(TABLE_BASE)},
      batch_size=2)
  assert sum(calls) == W  # One baseline pass for both quantized runs.
  single = evaluate_windows(WINDOWS, mask, table_forward(TABLE_BASE),
                            table_forward(TABLE_QUANT), batch_size=2)
  assert results["a"].metrics() == single.metrics()
  assert results["same"].metrics()["top1_agreement"] == 1.0


def test_batch_size_zero_rejected():
  with pytest.raises(ValueError, match=r"batch_size=0: must be >= 1"):
    evaluate_windows(WINDOWS, scored_mask(T, "all"),
                     table_forward(TABLE_BASE), batch_size=0)
