"""Scoring windows with a baseline and (optionally) a quantized forward pass.

Both passes see the same windows in the same batches; per-token metrics are
computed on device and only the scored predictions come back to the host.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.eval.perplexity import Perplexity, perplexity_from_nll
from kvq_jax.eval.token_metrics import compare_logits, next_token_nll

Forward = Callable[[np.ndarray], jax.Array]  # tokens [B, T] -> logits [B, T, V]


@dataclasses.dataclass(frozen=True)
class EvalResult:
  baseline: Perplexity
  quant: Perplexity | None
  kl_mean: float | None
  top1_agreement: float | None
  num_windows: int
  window_len: int
  num_scored_tokens: int

  def metrics(self) -> dict[str, float | int]:
    out = {
        "ppl_baseline": self.baseline.ppl,
        "ppl_baseline_stderr": self.baseline.stderr,
        "num_windows": self.num_windows,
        "window_len": self.window_len,
        "num_scored_tokens": self.num_scored_tokens,
    }
    if self.quant is not None:
      out.update({
          "ppl_quant": self.quant.ppl,
          "ppl_quant_stderr": self.quant.stderr,
          "delta_ppl": self.quant.ppl - self.baseline.ppl,
          "kl_mean": self.kl_mean,
          "top1_agreement": self.top1_agreement,
      })
    return out


_compare = jax.jit(compare_logits)
_nll = jax.jit(next_token_nll)


def evaluate_windows(windows_WxT: np.ndarray, mask_T: np.ndarray,
                     baseline: Forward, quant: Forward | None = None, *,
                     batch_size: int = 1,
                     progress: Callable[[int, int], None] | None = None
                     ) -> EvalResult:
  """Scores every window; `mask_T` [T-1] selects the counted predictions."""
  results = evaluate_many(windows_WxT, mask_T, baseline,
                          {} if quant is None else {"quant": quant},
                          batch_size=batch_size, progress=progress)
  return results["quant"] if quant is not None else results[None]


def evaluate_many(windows_WxT: np.ndarray, mask_T: np.ndarray,
                  baseline: Forward, quants: dict[str, Forward], *,
                  batch_size: int = 1,
                  progress: Callable[[int, int], None] | None = None
                  ) -> dict[str | None, EvalResult]:
  """One baseline pass per batch shared by every quantized forward.

  Returns {name: EvalResult} per entry of `quants`, and {None: baseline-only
  EvalResult} when `quants` is empty.
  """
  num_windows, window_len = windows_WxT.shape
  if batch_size < 1:
    raise ValueError(f"eval.batch_size={batch_size}: must be >= 1.")
  collected: dict[str | None, dict[str, list[np.ndarray]]] = {}
  for start in range(0, num_windows, batch_size):
    batch = windows_WxT[start:start + batch_size]
    tokens = jnp.asarray(batch)
    base_logits = baseline(batch)
    per_run = {None: {"nll_base": _nll(base_logits, tokens)}} if not quants \
        else {name: _compare(base_logits, fn(batch), tokens)
              for name, fn in quants.items()}
    for name, per_token in per_run.items():
      for key, value in per_token.items():
        collected.setdefault(name, {}).setdefault(key, []).append(
            np.asarray(value)[:, mask_T])
    if progress is not None:
      progress(min(start + batch_size, num_windows), num_windows)
  results = {}
  for name, lists in collected.items():
    flat = {k: np.concatenate(v).ravel() for k, v in lists.items()}
    has_quant = name is not None
    results[name] = EvalResult(
        baseline=perplexity_from_nll(flat["nll_base"]),
        quant=perplexity_from_nll(flat["nll_quant"]) if has_quant else None,
        kl_mean=float(flat["kl"].mean()) if has_quant else None,
        top1_agreement=float(flat["top1"].mean()) if has_quant else None,
        num_windows=num_windows, window_len=window_len,
        num_scored_tokens=int(flat["nll_base"].size))
  return results
