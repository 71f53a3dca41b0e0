"""Perplexity with llama.cpp's standard error.

llama.cpp (`tools/perplexity`) reports, over all scored predictions,
PPL = exp(mean nll) and its uncertainty PPL * sqrt(var(nll) / (count - 1)),
var being the population variance. `perplexity_from_nll` does the same.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Perplexity:
  ppl: float
  stderr: float
  mean_nll: float
  count: int


def perplexity_from_nll(nll) -> Perplexity:
  nll = np.asarray(nll, dtype=np.float64).ravel()
  if nll.size == 0:
    raise ValueError("perplexity of zero scored tokens is undefined; check "
                     "eval.window_len and eval.scoring.")
  if not np.all(np.isfinite(nll)):
    raise FloatingPointError(
        f"{int(np.sum(~np.isfinite(nll)))} of {nll.size} token NLLs are not "
        "finite: the model produced NaN/Inf logits.")
  mean = float(nll.mean())
  ppl = math.exp(mean)
  var = float(np.var(nll))  # Population variance, as llama.cpp.
  stderr = ppl * math.sqrt(var / (nll.size - 1)) if nll.size > 1 and var > 0 else 0.0
  return Perplexity(ppl=ppl, stderr=stderr, mean_nll=mean, count=int(nll.size))
