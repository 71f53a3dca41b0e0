"""Evaluation metrics recomputed in float64 numpy: an oracle for kvq_jax.eval.

Second-half scoring written out by hand: in a window of T tokens the scored
predictions are j = T/2 .. T-2 (logits at position j, target token j + 1).
"""

from __future__ import annotations

import pathlib

import numpy as np


def tiny_windows(tokenizer, text_path, window_len: int,
                 num_windows: int) -> np.ndarray:
  """The first num_windows * window_len tokens of the text, [W, T]."""
  ids = tokenizer.encode(pathlib.Path(text_path).read_text("utf-8"))
  return np.asarray(ids[:num_windows * window_len], np.int32).reshape(
      num_windows, window_len)


def second_half_metrics(windows_WxT: np.ndarray, base_logits,
                        quant_logits=None) -> dict:
  """ppl_baseline, num_scored_tokens (+ ppl_quant, kl_mean, top1_agreement)."""
  t = windows_WxT.shape[1]
  j = np.arange(t // 2, t - 1)
  targets = windows_WxT[:, j + 1]

  def log_softmax(logits):
    x = np.asarray(logits, np.float64)[:, j]
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))

  def ppl(logp):
    return float(np.exp(-np.take_along_axis(
        logp, targets[..., None], -1).mean()))

  base = log_softmax(base_logits)
  out = {"ppl_baseline": ppl(base), "num_scored_tokens": targets.size}
  if quant_logits is not None:
    quant = log_softmax(quant_logits)
    out.update(
        ppl_quant=ppl(quant),
        kl_mean=float((np.exp(base) * (base - quant)).sum(-1).mean()),
        top1_agreement=float((base.argmax(-1) == quant.argmax(-1)).mean()))
  return out


def assert_matches(metrics: dict, want: dict) -> None:
  """`metrics` (a run's) agree with `want` (second_half_metrics')."""
  if "num_scored_tokens" in metrics:
    assert metrics["num_scored_tokens"] == want["num_scored_tokens"]
  for key in ("ppl_baseline", "ppl_quant"):
    if key in want and key in metrics:
      assert abs(metrics[key] - want[key]) <= 1e-5 * want[key], (
          key, metrics[key], want[key])
  if "kl_mean" in want:
    # The library sums float32 log-probabilities: ~1e-7 absolute noise.
    got, kl = metrics["kl_mean"], want["kl_mean"]
    assert abs(got - kl) <= max(1e-3 * kl, 1e-7), (got, kl)
    assert metrics["top1_agreement"] == want["top1_agreement"]
