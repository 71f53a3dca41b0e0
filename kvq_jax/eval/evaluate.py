"""Scoring windows with a baseline and (optionally) a quantized forward pass.

Both passes see the same windows in the same batches; per-token metrics are
computed on device and only the scored predictions come back to the host.
They are kept per window ([W, N]) so that the quantized run's paired
statistics (`eval.paired`) can treat each window as one correlated cluster.
A forward may return a global array spanning several processes (a
multi-process mesh, `sharding.eval`): every process then calls this with
the same windows, and the per-token metrics are gathered to each of them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from kvq_jax.eval.paired import PairedStats, paired_stats
from kvq_jax.eval.perplexity import Perplexity, perplexity_from_nll
from kvq_jax.eval.token_metrics import compare_logits, next_token_nll

Forward = Callable[[np.ndarray], jax.Array]  # tokens [B, T] -> logits [B, T, V]


@dataclasses.dataclass(frozen=True)
class EvalResult:
  """One run's scores; `quant`, `kl_mean`, `top1_agreement` and `paired` are
  None for a baseline-only run.

  `baseline.stderr`/`quant.stderr` are llama.cpp's per-token standard errors
  (kept for comparison with llama.cpp); the quantized-vs-baseline
  uncertainties in `paired` are clustered over windows (`eval.paired`).
  """

  baseline: Perplexity
  quant: Perplexity | None
  kl_mean: float | None
  top1_agreement: float | None
  num_windows: int
  window_len: int
  num_scored_tokens: int
  paired: PairedStats | None = None
  # Per window, the sum of nll_quant - nll_base over its scored tokens
  # (None for a baseline-only run): what `sweep.pairs` pairs two points on.
  delta_nll_sums_W: np.ndarray | None = dataclasses.field(
      default=None, compare=False)
  # Per window, the sum of the per-token KL(baseline || quantized): a
  # pairing of KL too (less noisy than ΔNLL: no dependence on which token
  # came next).
  kl_sums_W: np.ndarray | None = dataclasses.field(
      default=None, compare=False)

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
    if self.paired is not None:
      out.update(self.paired.metrics())
    return out


_compare = jax.jit(compare_logits)
_nll = jax.jit(next_token_nll)


def _to_host(x: jax.Array) -> np.ndarray:
  """`x` on the host; gathered from every process when it spans several
  (the forwards of a multi-process mesh, `sharding.eval`)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(x)


def _checked(logits_BxTxV: jax.Array, positions: int) -> jax.Array:
  if logits_BxTxV.shape[1] != positions:
    raise ValueError(
        f"evaluate_many: a forward returned logits for "
        f"{logits_BxTxV.shape[1]} positions, expected {positions} (the "
        "window length, or `tail`).")
  return logits_BxTxV


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
                  progress: Callable[[int, int], None] | None = None,
                  tail: int | None = None
                  ) -> dict[str | None, EvalResult]:
  """One baseline pass per batch shared by every quantized forward.

  Returns {name: EvalResult} per entry of `quants` (with window-clustered
  `paired` statistics), and {None: baseline-only EvalResult} when `quants`
  is empty.

  `tail` K (None: every position): the forwards return the logits of each
  window's last K positions only, [B, K, V] (`facade.chunked_window_forward`
  with keep=K, `windows.logits_needed`), so only predictions j >= T - K can
  be scored; a `mask_T` selecting an earlier one is a ValueError.
  """
  num_windows, window_len = windows_WxT.shape
  if batch_size < 1:
    raise ValueError(f"eval.batch_size={batch_size}: must be >= 1.")
  first = 0
  if tail is not None:
    if not 2 <= tail <= window_len:
      raise ValueError(f"evaluate_many: tail={tail}; allowed: 2..{window_len} "
                       "(the window length), or None for every position.")
    first = window_len - tail
    if np.asarray(mask_T)[:first].any():
      raise ValueError(
          f"evaluate_many: tail={tail} logits cover predictions "
          f"{first}..{window_len - 2}, but the mask scores earlier ones; "
          f"allowed: tail >= windows.logits_needed(mask) = "
          f"{window_len + 1 - int(np.argmax(mask_T))}.")
  mask_tail = np.asarray(mask_T)[first:]
  collected: dict[str | None, dict[str, list[np.ndarray]]] = {}
  for start in range(0, num_windows, batch_size):
    batch = windows_WxT[start:start + batch_size]
    tokens = jnp.asarray(batch[:, first:])
    base_logits = _checked(baseline(batch), window_len - first)
    per_run = {None: {"nll_base": _nll(base_logits, tokens)}} if not quants \
        else {name: _compare(base_logits,
                             _checked(fn(batch), window_len - first), tokens)
              for name, fn in quants.items()}
    for name, per_token in per_run.items():
      for key, value in per_token.items():
        collected.setdefault(name, {}).setdefault(key, []).append(
            _to_host(value)[:, mask_tail])
    if progress is not None:
      progress(min(start + batch_size, num_windows), num_windows)
  results = {}
  for name, lists in collected.items():
    per_window = {k: np.concatenate(v, axis=0) for k, v in lists.items()}
    baseline_ppl = perplexity_from_nll(per_window["nll_base"])
    quant_ppl, paired = None, None
    if name is not None:  # Perplexity first: it rejects non-finite NLLs.
      quant_ppl = perplexity_from_nll(per_window["nll_quant"])
      paired = paired_stats(per_window["nll_base"], per_window["nll_quant"],
                            per_window["kl"], per_window["top1"])
    results[name] = EvalResult(
        baseline=baseline_ppl, quant=quant_ppl,
        kl_mean=None if paired is None else paired.kl.mean,
        top1_agreement=None if paired is None else paired.top1.mean,
        num_windows=num_windows, window_len=window_len,
        num_scored_tokens=int(per_window["nll_base"].size), paired=paired,
        delta_nll_sums_W=None if name is None else np.sum(
            per_window["nll_quant"].astype(np.float64)
            - per_window["nll_base"], axis=1),
        kl_sums_W=None if name is None else np.sum(
            per_window["kl"].astype(np.float64), axis=1))
  return results
