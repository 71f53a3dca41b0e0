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


def window_se(values_WxN):
  """Stderr of the mean over windows for equal-size windows (rows)."""
  means = np.asarray(values_WxN, np.float64).mean(axis=1)
  return means.std(ddof=1) / math.sqrt(len(means))


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
      "num_scored_tokens", "delta_nll_mean", "delta_nll_stderr",
      "delta_ppl_ci95_low", "delta_ppl_ci95_high", "kl_stderr", "top1_stderr"}
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
  # Paired statistics: windows are the clusters (equal token counts, so the
  # stderr is the sample std of the W window means over sqrt(W)).
  diff = nll_q.astype(np.float64) - nll_b
  assert metrics["delta_nll_mean"] == pytest.approx(diff.mean(), rel=1e-5)
  assert metrics["delta_nll_stderr"] == pytest.approx(
      window_se(diff), rel=1e-4)
  assert metrics["kl_stderr"] == pytest.approx(window_se(kl), rel=1e-4)
  assert metrics["top1_stderr"] == pytest.approx(
      window_se(top1.astype(float)), rel=1e-6)
  scale = math.exp(nll_b.mean())
  for key, sign in (("delta_ppl_ci95_low", -1), ("delta_ppl_ci95_high", 1)):
    assert metrics[key] == pytest.approx(
        scale * (math.exp(diff.mean() + sign * 1.96 * window_se(diff)) - 1),
        rel=1e-4)
  assert (metrics["delta_ppl_ci95_low"] < metrics["delta_ppl"]
          < metrics["delta_ppl_ci95_high"])
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
  assert metrics["delta_nll_mean"] == 0.0 and metrics["delta_nll_stderr"] == 0
  assert metrics["delta_ppl_ci95_low"] == metrics["delta_ppl_ci95_high"] == 0
  assert metrics["top1_stderr"] == 0.0


def window_boost_forward(boost_W):
  """Uniform logits, except that position t's next token gets +boost_W[w]
  in window w (identified by its first token, = w): every scored token of a
  window has the same NLL, so tokens within a window are fully correlated."""
  def forward(tokens_BxT):
    tokens = np.asarray(tokens_BxT)
    logits = np.zeros(tokens.shape + (V,), np.float32)
    b, t = np.meshgrid(np.arange(tokens.shape[0]),
                       np.arange(tokens.shape[1] - 1), indexing="ij")
    logits[b, t, tokens[:, 1:]] = np.asarray(boost_W)[tokens[:, :1]]
    return logits
  return forward


@pytest.mark.parametrize("batch_size", [1, 3])
def test_stderr_is_over_windows_not_tokens(batch_size):
  boost = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
  windows = RNG.integers(0, V, size=(4, T)).astype(np.int32)
  windows[:, 0] = np.arange(4)
  results = evaluate_many(windows, scored_mask(T, "all"),
                          window_boost_forward(np.zeros(4, np.float32)),
                          {"q": window_boost_forward(boost)},
                          batch_size=batch_size)
  metrics = results["q"].metrics()
  # Window w's every token: nll_base = ln V, nll_quant = ln(e^a + V - 1) - a.
  diff_w = np.log((np.exp(boost) + V - 1) / V) - boost
  n = T - 1  # Tokens per window.
  # Window means diff_w: stderr = std(diff_w, ddof=1) / sqrt(4).
  clustered = diff_w.std(ddof=1) / 2
  # Ignoring windows (each diff_w counted n times), the per-token stderr
  # sqrt(var_pop / (4n - 1)), var_pop = S / 4 with S = sum_w (diff_w - mean)^2,
  # is sqrt(S / (4 (4n - 1))) against the clustered sqrt(S / 12): smaller by
  # sqrt((4n - 1) / 3) = sqrt(19 / 3). Flattening the windows breaks this.
  naive = math.sqrt(np.var(np.repeat(diff_w, n)) / (4 * n - 1))
  assert metrics["delta_nll_mean"] == pytest.approx(diff_w.mean(), rel=1e-5)
  assert metrics["delta_nll_stderr"] == pytest.approx(clustered, rel=1e-4)
  assert metrics["delta_nll_stderr"] == pytest.approx(
      naive * math.sqrt(19 / 3), rel=1e-4)
  # KL(uniform || q_w) is also constant within a window.
  kl_w = np.log((np.exp(boost) + V - 1) / V) - boost / V
  assert metrics["kl_mean"] == pytest.approx(kl_w.mean(), rel=1e-5)
  assert metrics["kl_stderr"] == pytest.approx(kl_w.std(ddof=1) / 2,
                                               rel=1e-4)


def test_single_window_has_undefined_paired_stderr():
  metrics = evaluate_windows(
      WINDOWS[:1], scored_mask(T, "all"), table_forward(TABLE_BASE),
      table_forward(TABLE_QUANT)).metrics()
  assert metrics["num_windows"] == 1
  for key in ("delta_nll_stderr", "delta_ppl_ci95_low", "delta_ppl_ci95_high",
              "kl_stderr", "top1_stderr"):
    assert math.isnan(metrics[key]), key
  assert metrics["ppl_quant_stderr"] > 0  # The per-token one still exists.


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
