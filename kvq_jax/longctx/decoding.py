"""Prefill and step-by-step decode through a (quantized) cache.

Shared by the passkey and decode-agreement experiments. Every sequence runs
through the real serving path, `models.runtime.Runtime`: the prompt is
prefilled in chunks (`config.eval.prefill_chunk`, `PREFILL_CHUNK` = 512
tokens by default), so a long context never materialises [T, T] attention
scores or [T, V] logits for the whole prompt; then one `Runtime.decode`
call per generated token, each reading the cache the previous call wrote.
Passkey prompts run one at a time (batch 1), like the evaluation windows:
XLA:CPU rounds differently for different batch shapes, and a quantized cache
turns such ulps into code flips, so a result depends on its own prompt only.
The agreement experiment decodes its prompts in batches (`run_rows`; one
decode step then reads the weights once for B tokens), the same batches for
the baseline and every preset, so each comparison is still on identical
shapes.

`step_rows` is the one decode loop: greedy (feed back the argmax) or
teacher-forced (feed given tokens), the only difference being which token
goes into the next step.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from kvq_jax.cache.base import LayerCache
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.facade import load_model
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.sweep.resolve import check_points
from kvq_jax.sweep.resolve import resolve_points  # noqa: F401 (re-exported)

PREFILL_CHUNK = 512
BASELINE = "baseline"  # Name of the full-precision pass in every output.


def load_for_request(config: ml_collections.ConfigDict, request, model,
                     what: str, points: str | Sequence[str] | None = None):
  """(settings, request with its prefill_chunk resolved, the loaded model).

  `request.prefill_chunk` None takes the config's `eval.prefill_chunk`;
  `model` overrides `config.model`; `points` (`--points`) are parsed before
  the model loads (`sweep.resolve.check_points`). ValueError (prefixed by
  `what`) when the model has no tokenizer.
  """
  settings = settings_from_config(config)
  check_points(settings, points)
  if request.prefill_chunk is None:
    request = dataclasses.replace(
        request, prefill_chunk=settings.eval.prefill_chunk)
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  if lm.tokenizer is None:
    raise ValueError(f"{what}: model {model_name!r} has no tokenizer; "
                     "allowed: a checkpoint that carries one.")
  return settings, request, lm


def positive_int(value: int, what: str) -> int:
  """`value` if it is an int >= 1, else ValueError naming `what`."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{what}={value!r}: allowed: an integer >= 1.")
  return value


def positive_ints(values: Sequence[int], what: str) -> tuple[int, ...]:
  """`values` as a non-empty tuple of ints >= 1 (ValueError naming `what`)."""
  out = tuple(values)
  if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                    for v in out):
    raise ValueError(f"{what}={list(out)!r}: allowed: one or more integers "
                     ">= 1.")
  return out


def new_cache(runtime: Runtime, spec: CacheSpec | None, capacity: int,
              cache_dtype: str, batch_size: int = 1) -> list[LayerCache]:
  """An empty cache: full precision (`spec` None) or quantized."""
  return init_cache(runtime.config, batch_size, capacity, spec,
                    jnp.dtype(cache_dtype))


def prefill_chunked(runtime: Runtime, cache: Sequence[LayerCache],
                    prompt_T: np.ndarray, chunk: int = PREFILL_CHUNK
                    ) -> tuple[np.ndarray, list[LayerCache]]:
  """Prefills `prompt_T` chunk by chunk; returns (logits [V] of the last
  prompt token, float32 numpy, and the cache holding the whole prompt).

  `prefill_rows` for one sequence. The cache argument is donated.
  """
  prompt_T = np.asarray(prompt_T, np.int32)
  if prompt_T.ndim != 1 or prompt_T.size == 0:
    raise ValueError(f"prefill_chunked: prompt of shape {prompt_T.shape}; "
                     "allowed: a non-empty 1-D array of token ids.")
  logits_1xV, cache = prefill_rows(runtime, cache, prompt_T[None], chunk)
  return logits_1xV[0], cache


def prefill_rows(runtime: Runtime, cache: Sequence[LayerCache],
                 prompts_BxT: np.ndarray, chunk: int = PREFILL_CHUNK
                 ) -> tuple[np.ndarray, list[LayerCache]]:
  """Prefills B prompts of one length together, chunk by chunk; returns
  (float32 logits [B, V] of each prompt's last token, the cache).

  Every chunk but the last has `chunk` tokens, so prompts of one length
  share two compiled programs; the output head runs on each chunk's last
  position only (`Runtime.prefill_last`). The cache argument is donated.
  """
  prompts_BxT = np.asarray(prompts_BxT, np.int32)
  if prompts_BxT.ndim != 2 or prompts_BxT.size == 0:
    raise ValueError(f"prefill_rows: prompts of shape {prompts_BxT.shape}; "
                     "allowed: a non-empty [B, T] array of token ids.")
  if chunk < 1:
    raise ValueError(f"prefill_rows: chunk={chunk}; allowed: >= 1.")
  cache = list(cache)
  logits_BxV = None
  for start in range(0, prompts_BxT.shape[1], chunk):
    logits_BxV, cache = runtime.prefill_last(
        prompts_BxT[:, start:start + chunk], cache)
  return np.asarray(logits_BxV, np.float32), cache


class SharedPrefill:
  """Chunked prefill that computes a prefix shared by successive prompts once.

  `prefill_chunked` writes the cache chunk by chunk, and the cache after
  chunk k depends only on the tokens of chunks 0..k (and on the capacity and
  the spec). So a prompt whose first k * chunk tokens are those of the
  *trunk* (a cache kept at a chunk boundary) resumes from a copy of it: the
  same compiled programs on the same inputs, hence the same cache, logits
  and answers as prefilling it from scratch, bit for bit.

  `prefill(prompt_T, shared_len)`: the first `shared_len` tokens of this
  prompt are ones the next prompts will share (the passkey filler before
  the key). The trunk is restarted when it no longer matches the prompt (or
  the capacity changes), advanced with this prompt's tokens to the last
  chunk boundary <= shared_len, copied, and the prompt's remaining chunks
  run on the copy. Prompts sorted by shared length in a group that really
  shares its prefix pay each shared chunk once. `chunks_run` counts the
  prefill calls made (trunk and prompts).
  """

  def __init__(self, runtime: Runtime, spec: CacheSpec | None,
               cache_dtype: str, chunk: int = PREFILL_CHUNK):
    if chunk < 1:
      raise ValueError(f"SharedPrefill: chunk={chunk}; allowed: >= 1.")
    self._runtime, self._spec = runtime, spec
    self._dtype, self._chunk = cache_dtype, chunk
    self._trunk = None
    self._trunk_ids = np.zeros(0, np.int32)
    self._capacity = -1
    self.chunks_run = 0

  def _run(self, cache, ids_T: np.ndarray):
    self.chunks_run += -(-ids_T.size // self._chunk)
    return prefill_rows(self._runtime, cache, ids_T[None], self._chunk)

  def prefill(self, prompt_T: np.ndarray, shared_len: int, capacity: int
              ) -> tuple[np.ndarray, list[LayerCache]]:
    """(logits [V] of the last prompt token, the cache holding the prompt);
    the cache has `capacity` slots (>= the prompt's length)."""
    prompt_T = np.asarray(prompt_T, np.int32)
    if prompt_T.ndim != 1 or prompt_T.size == 0 or capacity < prompt_T.size:
      raise ValueError(
          f"SharedPrefill.prefill: prompt of shape {prompt_T.shape}, "
          f"capacity {capacity}; allowed: a non-empty 1-D prompt and a "
          "capacity >= its length.")
    held = self._trunk_ids.size
    if (capacity != self._capacity or self._trunk is None
        or not np.array_equal(self._trunk_ids, prompt_T[:held])):
      self._trunk = new_cache(self._runtime, self._spec, capacity,
                              self._dtype)
      self._trunk_ids, self._capacity, held = prompt_T[:0], capacity, 0
    # Never the whole prompt: its last chunk must run for its logits.
    boundary = min(max(shared_len, 0), prompt_T.size - 1)
    boundary -= boundary % self._chunk
    if boundary > held:
      _, self._trunk = self._run(self._trunk, prompt_T[held:boundary])
      self._trunk_ids = prompt_T[:boundary].copy()
      held = boundary
    cache = jax.tree.map(jnp.copy, self._trunk)
    logits_1xV, cache = self._run(cache, prompt_T[held:])
    return logits_1xV[0], cache


@dataclasses.dataclass(frozen=True)
class Steps:
  """What `step_through` saw at every decode step of one sequence.

  logits_NxV[i] is the next-token distribution (float32 logits) at step i
  (step 0: from the prompt's last token); argmax_N[i] its greedy choice;
  fed_N[i] the token written into the cache after step i (the greedy choice,
  or the forced token) -- the last step's token is never fed, so fed_N has
  N - 1 entries.
  """

  logits_NxV: np.ndarray
  argmax_N: np.ndarray
  fed_N: np.ndarray


def step_through(runtime: Runtime, cache: Sequence[LayerCache],
                 first_logits_V: np.ndarray, num_steps: int,
                 forced_N: Sequence[int] | None = None, *,
                 keep_logits: bool = True) -> Steps:
  """`step_rows` for one sequence (first_logits_V [V], forced_N [>= N-1])."""
  forced = None if forced_N is None else np.asarray(forced_N)[None]
  return step_rows(runtime, cache, np.asarray(first_logits_V)[None],
                   num_steps, forced, keep_logits=keep_logits)[0]


def step_rows(runtime: Runtime, cache: Sequence[LayerCache],
              first_logits_BxV: np.ndarray, num_steps: int,
              forced_BxN: np.ndarray | None = None, *,
              keep_logits: bool = True) -> list[Steps]:
  """Decodes `num_steps` tokens of B sequences, one `Runtime.decode` call
  per step; returns one `Steps` per sequence.

  Greedy when `forced_BxN` is None (each step feeds its own argmax back);
  teacher-forced otherwise: step i feeds `forced_BxN[:, i]` whatever the
  model would have chosen, so two caches compared this way see identical
  token prefixes. End-of-sequence tokens do not stop the loop (a fixed
  number of steps keeps every comparison the same length). The cache
  argument is donated; it needs room for `num_steps - 1` more tokens. With
  `keep_logits=False`, each logits_NxV is empty ([0, V]).
  """
  logits_BxV = np.asarray(first_logits_BxV, np.float32)
  b, vocab = logits_BxV.shape
  if num_steps < 1:
    raise ValueError(f"step_through: num_steps={num_steps}; allowed: >= 1.")
  if forced_BxN is not None:
    forced_BxN = np.asarray(forced_BxN)
    if forced_BxN.shape[0] != b or forced_BxN.shape[1] < num_steps - 1:
      raise ValueError(
          f"step_through: {forced_BxN.shape[1]} forced tokens for "
          f"{num_steps} steps (shape {forced_BxN.shape}, {b} sequences); "
          f"allowed: at least num_steps - 1 = {num_steps - 1} per sequence.")
  cache = list(cache)
  logits, argmax, fed = [], [], []
  for step in range(num_steps):
    choice_B = np.argmax(logits_BxV, axis=-1).astype(np.int32)
    argmax.append(choice_B)
    if keep_logits:
      logits.append(logits_BxV)
    if step == num_steps - 1:
      break
    token_B = (choice_B if forced_BxN is None
               else forced_BxN[:, step].astype(np.int32))
    fed.append(token_B)
    logits_BxV, cache = runtime.decode(token_B, cache)
    logits_BxV = np.asarray(logits_BxV, np.float32)
  argmax_BxN = np.stack(argmax, axis=1)
  fed_BxN = (np.stack(fed, axis=1) if fed
             else np.zeros((b, 0), np.int32))
  logits_BxNxV = (np.stack(logits, axis=1) if keep_logits
                  else np.zeros((b, 0, vocab), np.float32))
  return [Steps(logits_NxV=logits_BxNxV[i], argmax_N=argmax_BxN[i],
                fed_N=fed_BxN[i]) for i in range(b)]


def run_sequence(runtime: Runtime, spec: CacheSpec | None, cache_dtype: str,
                 prompt_T: np.ndarray, num_steps: int,
                 forced_N: Sequence[int] | None = None, *,
                 chunk: int = PREFILL_CHUNK,
                 keep_logits: bool = True) -> Steps:
  """`run_rows` for one prompt."""
  forced = None if forced_N is None else np.asarray(forced_N)[None]
  return run_rows(runtime, spec, cache_dtype, np.asarray(prompt_T)[None],
                  num_steps, forced, chunk=chunk, keep_logits=keep_logits)[0]


def run_rows(runtime: Runtime, spec: CacheSpec | None, cache_dtype: str,
             prompts_BxT: np.ndarray, num_steps: int,
             forced_BxN: np.ndarray | None = None, *,
             chunk: int = PREFILL_CHUNK,
             keep_logits: bool = True) -> list[Steps]:
  """A fresh cache of `spec` for B prompts of one length, prefilled in
  chunks (`prefill_rows`), then `step_rows` (greedy, or teacher-forced with
  `forced_BxN`)."""
  prompts_BxT = np.asarray(prompts_BxT, np.int32)
  cache = new_cache(runtime, spec, prompts_BxT.shape[1] + num_steps,
                    cache_dtype, batch_size=prompts_BxT.shape[0])
  first_BxV, cache = prefill_rows(runtime, cache, prompts_BxT, chunk)
  return step_rows(runtime, cache, first_BxV, num_steps, forced_BxN,
                   keep_logits=keep_logits)


def resolved_config_json(config: ml_collections.ConfigDict,
                         model: str) -> str:
  """The resolved config as JSON, `model` set to what actually ran."""
  resolved = config.copy_and_resolve_references()
  resolved.model = model
  return resolved.to_json_best_effort(indent=2)


def file_stem(name: str) -> str:
  """A point name (may hold '/', ':') as a safe file-name part."""
  return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def write_csv(path: str | os.PathLike, rows: Sequence[dict]) -> None:
  """Rows as CSV, columns in first-seen order (a missing value is empty)."""
  columns: dict[str, None] = {}
  for row in rows:
    columns.update(dict.fromkeys(row))
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
    writer.writeheader()
    writer.writerows(rows)


def run_info(wall_seconds: float, machine: str, peak_rss: float) -> dict:
  """The run facts every summary.md and JSON carry."""
  return {"wall_seconds": wall_seconds, "peak_rss_gib": peak_rss,
          "machine": machine}


def info_lines(info: dict) -> list[str]:
  """Markdown lines for `run_info`'s facts."""
  return [f"Machine: {info['machine']}.",
          "",
          f"Wall time {info['wall_seconds']:.1f} s (model load and "
          f"compilation included), peak RSS {info['peak_rss_gib']:.2f} GiB."]
