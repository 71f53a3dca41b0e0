"""The three calls lm-evaluation-harness makes of a model, through a cache.

`CacheLM(model, spec, cache_dtype)` answers lm-eval's request lists with
plain tuples (`lm_eval_model.KvqJaxLM` unwraps lm-eval's `Instance.args`
into them), so it is tested without lm-eval (an optional extra CI does not install):

* `loglikelihood([(context, continuation)])` -> [(logprob, is_greedy)]:
  context and continuation are tokenized apart (BOS before the context
  where the tokenizer adds one; an empty context is BOS, or the
  continuation's first token when there is no BOS) and the whole sequence
  (at most `max_length` tokens, the last ones kept) runs through
  `facade.window_forward` with the cache spec: the
  evaluation's own path (one window, a fresh cache, the prompt written into
  the quantized cache and attended from it), so the log-probability equals
  the project's NLL of the same tokens.
* `loglikelihood_rolling([(text,)])` -> [logprob]: every token of the text
  predicted once, after BOS, in windows of at most `max_length` tokens
  that each predict the tokens the previous ones did not (all but the
  window's first token; lm-eval's `get_rolling_token_windows` with
  context_len 1).
* `generate_until([(context, {"until": [...], "max_gen_toks": N})])` ->
  [text]: greedy, every request served by the continuous-batching engine
  over the paged cache, stopped at EOS, at any `until` string (cut from the
  text) or after max_gen_toks.

Each distinct sequence length compiles once (no padding: a format whose
scales span tokens would see the padding).
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from kvq_jax.cache.paged.layer import DEFAULT_PAGE_SIZE
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.facade import LoadedModel, window_forward
from kvq_jax.models.runtime import Runtime
from kvq_jax.serving.engine import Engine, EngineConfig
from kvq_jax.serving.request import Request


def _log_softmax(logits_TxV: np.ndarray) -> np.ndarray:
  x = np.asarray(logits_TxV, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
  """`text` up to the first occurrence of any stop string."""
  cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0),
            default=len(text))
  return text[:cut]


class CacheLM:
  """lm-eval's model calls (module docstring) over one cache spec."""

  def __init__(self, lm: LoadedModel, spec: CacheSpec | None, cache_dtype,
               *, max_length: int | None = None, batch: int = 8,
               max_gen_toks: int = 256):
    if lm.tokenizer is None:
      raise ValueError("CacheLM: the model has no tokenizer.")
    self.lm, self.spec, self.cache_dtype = lm, spec, cache_dtype
    limit = lm.config.max_position_embeddings
    self.max_length = min(max_length or 2048, limit)
    self.batch, self.max_gen_toks = batch, max_gen_toks
    self._forward = window_forward(lm, spec, cache_dtype)

  @property
  def tokenizer(self):
    return self.lm.tokenizer

  def _bos(self) -> list[int]:
    tok = self.tokenizer
    return [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []

  def _encode_pair(self, context: str, continuation: str
                   ) -> tuple[list[int], list[int]]:
    ctx = self.tokenizer.encode(context) if context else self._bos()
    cont = self.tokenizer.encode(continuation, add_bos=False)
    if not cont:
      raise ValueError(f"loglikelihood: continuation {continuation!r} "
                       "tokenizes to nothing.")
    if not ctx:  # No BOS: the first continuation token is the context.
      ctx, cont = cont[:1], cont[1:]
    return ctx, cont

  def token_logprobs(self, ids: Sequence[int], num_scored: int
                     ) -> tuple[np.ndarray, bool]:
    """(log p of the last `num_scored` tokens given the ones before, whether
    each was the argmax), one fresh window through the cache."""
    ids = list(ids)[-self.max_length:]
    if not 1 <= num_scored < len(ids):
      raise ValueError(f"token_logprobs: {num_scored} scored of {len(ids)} "
                       "tokens; allowed: 1 .. len - 1.")
    # The whole sequence goes in, as an evaluation window does: a format
    # whose scales span tokens (per-channel keys) sees the same tokens.
    logits = np.asarray(self._forward(np.asarray(ids, np.int32)[None]),
                        np.float32)[0]
    logp = _log_softmax(logits[-num_scored - 1:-1])
    targets = np.asarray(ids[-num_scored:])
    picked = logp[np.arange(num_scored), targets]
    greedy = bool(np.all(logp.argmax(-1) == targets))
    return picked, greedy

  def loglikelihood(self, requests: Sequence[tuple[str, str]]
                    ) -> list[tuple[float, bool]]:
    out = []
    for context, continuation in requests:
      ctx, cont = self._encode_pair(context, continuation)
      if not cont:
        out.append((0.0, True))
        continue
      picked, greedy = self.token_logprobs(ctx + cont, len(cont))
      out.append((float(picked.sum()), greedy))
    return out

  def rolling_windows(self, text: str) -> list[tuple[list[int], int]]:
    """(ids, predictions) per window: each window's ids end with its
    `predictions` tokens and hold at most `max_length` tokens."""
    full = self._bos() + self.tokenizer.encode(text, add_bos=False)
    if len(full) < 2:
      raise ValueError(f"loglikelihood_rolling: {text!r} has no token to "
                       "predict.")
    windows, n = [], len(full) - 1  # Predict full[1:].
    step = self.max_length - 1  # A window predicts all but its first token.
    for i in range(0, n, step):
      count = min(step, n - i)
      end = 1 + i + count
      windows.append((full[max(0, end - self.max_length):end], count))
    return windows

  def loglikelihood_rolling(self, requests: Sequence[tuple[str]]
                            ) -> list[float]:
    out = []
    for (text,) in requests:
      total = 0.0
      for ids, count in self.rolling_windows(text):
        picked, _ = self.token_logprobs(ids, count)
        total += float(picked.sum())
      out.append(total)
    return out

  def generate_until(self, requests: Sequence[tuple[str, dict]]
                     ) -> list[str]:
    prompts, stops, limits = [], [], []
    for context, kwargs in requests:
      kwargs = dict(kwargs or {})
      until = kwargs.pop("until", None) or []
      until = [until] if isinstance(until, str) else list(until)
      limit = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
      if kwargs.pop("do_sample", False) or kwargs.pop("temperature", 0.0):
        raise ValueError("generate_until: only greedy decoding is "
                         "supported (do_sample=False, temperature=0).")
      ids = (self.tokenizer.encode(context) or self._bos())
      ids = ids[-(self.max_length - limit):]
      prompts.append(ids)
      stops.append(tuple(until))
      limits.append(limit)
    if not prompts:
      return []
    max_context = max(len(p) + n for p, n in zip(prompts, limits))
    pages = -(-max_context // DEFAULT_PAGE_SIZE)
    engine = Engine(Runtime(self.lm.decoder), EngineConfig(
        max_slots=self.batch, num_pages=self.batch * pages + 2,
        max_context=max_context, cache_spec=self.spec,
        cache_dtype=self.cache_dtype), self.tokenizer)
    results = engine.run([Request(i, p, n, stop=s)
                          for i, (p, n, s) in enumerate(zip(prompts, limits,
                                                            stops))])
    jax.clear_caches()
    return [cut_at_stops(self.tokenizer.decode(r.new_ids,
                                               skip_special_tokens=True), s)
            for r, s in zip(results, stops)]
