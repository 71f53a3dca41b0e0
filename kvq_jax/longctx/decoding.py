"""Prefill and step-by-step decode through a (quantized) cache, batch 1.

Shared by the passkey and decode-agreement experiments. Every sequence runs
through the real serving path, `models.runtime.Runtime`: the prompt is
prefilled in chunks (`config.eval.prefill_chunk`, `PREFILL_CHUNK` = 512
tokens by default), so a long context never materialises [T, T] attention
scores or [T, V] logits for the whole prompt; then one `Runtime.decode`
call per generated token, each reading the cache the previous call wrote.
Sequences run one at a time (batch 1), like the evaluation windows: XLA:CPU
rounds differently for different batch shapes, and a quantized cache turns
such ulps into code flips, so a result depends on its own prompt only.

`step_through` is the one decode loop: greedy (feed back the argmax) or
teacher-forced (feed given tokens), the only difference being which token
goes into the next step.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

from kvq_jax.cache.base import LayerCache
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.experiment.settings import ExperimentSettings, settings_from_config
from kvq_jax.facade import load_model
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.runtime import Runtime
from kvq_jax.sweep.grid import SweepPoint
from kvq_jax.sweep.points import parse_points
from kvq_jax.sweep.runner import unique_points

PREFILL_CHUNK = 512
BASELINE = "baseline"  # Name of the full-precision pass in every output.


def load_for_request(config: ml_collections.ConfigDict, request, model,
                     what: str):
  """(settings, request with its prefill_chunk resolved, the loaded model).

  `request.prefill_chunk` None takes the config's `eval.prefill_chunk`;
  `model` overrides `config.model`. ValueError (prefixed by `what`) when the
  model has no tokenizer.
  """
  settings = settings_from_config(config)
  if request.prefill_chunk is None:
    request = dataclasses.replace(
        request, prefill_chunk=settings.eval.prefill_chunk)
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  if lm.tokenizer is None:
    raise ValueError(f"{what}: model {model_name!r} has no tokenizer; "
                     "allowed: a checkpoint that carries one.")
  return settings, request, lm


def check_context(config: ModelConfig, num_tokens: int, what: str) -> None:
  """Raises ValueError when `num_tokens` exceed the model's trained positions.

  `what` names the setting in the message (e.g. '--contexts=16384').
  """
  limit = config.max_position_embeddings
  if num_tokens > limit:
    raise ValueError(
        f"{what}: {num_tokens} tokens exceed the model's "
        f"max_position_embeddings={limit}; allowed: at most {limit} tokens "
        "(positions past the trained range measure the model's RoPE "
        "extrapolation, not the cache).")


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


def resolve_points(settings: ExperimentSettings, config_name: str,
                   points: str | Sequence[str] | None,
                   model_config: ModelConfig) -> list[SweepPoint]:
  """The presets to compare with the baseline, resolved as the sweep does.

  With `points`, every item is parsed by `sweep.points.parse_points` on top
  of the base preset's cache settings (duplicates evaluated once, a name
  clash refused); without, the base preset itself (named `config_name`),
  or nothing when it does not quantize (baseline only).
  """
  if points:
    return unique_points(parse_points(
        points, settings.cache_spec, head_dim=model_config.head_dim,
        num_layers=model_config.num_layers))
  if settings.quantize and settings.cache_spec is not None:
    return [SweepPoint(config_name, settings.cache_spec, source="preset")]
  return []


def new_cache(runtime: Runtime, spec: CacheSpec | None, capacity: int,
              cache_dtype: str) -> list[LayerCache]:
  """An empty batch-1 cache: full precision (`spec` None) or quantized."""
  return init_cache(runtime.config, 1, capacity, spec, jnp.dtype(cache_dtype))


def prefill_chunked(runtime: Runtime, cache: Sequence[LayerCache],
                    prompt_T: np.ndarray, chunk: int = PREFILL_CHUNK
                    ) -> tuple[np.ndarray, list[LayerCache]]:
  """Prefills `prompt_T` chunk by chunk; returns (logits [V] of the last
  prompt token, float32 numpy, and the cache holding the whole prompt).

  Every chunk but the last has `chunk` tokens, so prompts of one length
  share two compiled programs. The cache argument is donated.
  """
  prompt_T = np.asarray(prompt_T, np.int32)
  if prompt_T.ndim != 1 or prompt_T.size == 0:
    raise ValueError(f"prefill_chunked: prompt of shape {prompt_T.shape}; "
                     "allowed: a non-empty 1-D array of token ids.")
  if chunk < 1:
    raise ValueError(f"prefill_chunked: chunk={chunk}; allowed: >= 1.")
  cache = list(cache)
  logits_1xTxV = None
  for start in range(0, prompt_T.size, chunk):
    piece_1xT = prompt_T[None, start:start + chunk]
    logits_1xTxV, cache = runtime.prefill(piece_1xT, cache)
  return np.asarray(logits_1xTxV[0, -1], np.float32), cache


@dataclasses.dataclass(frozen=True)
class Steps:
  """What `step_through` saw at every decode step.

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
  """Decodes `num_steps` tokens one `Runtime.decode` call at a time.

  Greedy when `forced_N` is None (each step feeds its own argmax back);
  teacher-forced otherwise: step i feeds `forced_N[i]` whatever the model
  would have chosen, so two caches compared this way see identical token
  prefixes. End-of-sequence tokens do not stop the loop (a fixed number of
  steps keeps every comparison the same length). The cache argument is
  donated; it needs room for `num_steps - 1` more tokens. With
  `keep_logits=False`, logits_NxV is empty ([0, V]).
  """
  if num_steps < 1:
    raise ValueError(f"step_through: num_steps={num_steps}; allowed: >= 1.")
  if forced_N is not None and len(forced_N) < num_steps - 1:
    raise ValueError(
        f"step_through: {len(forced_N)} forced tokens for {num_steps} steps; "
        f"allowed: at least num_steps - 1 = {num_steps - 1}.")
  cache = list(cache)
  logits_V = np.asarray(first_logits_V, np.float32)
  logits, argmax, fed = [], [], []
  for step in range(num_steps):
    choice = int(np.argmax(logits_V))
    argmax.append(choice)
    if keep_logits:
      logits.append(logits_V)
    if step == num_steps - 1:
      break
    token = choice if forced_N is None else int(forced_N[step])
    fed.append(token)
    logits_1xV, cache = runtime.decode(np.asarray([token], np.int32), cache)
    logits_V = np.asarray(logits_1xV[0], np.float32)
  vocab = logits_V.shape[-1]
  return Steps(
      logits_NxV=(np.stack(logits) if keep_logits
                  else np.zeros((0, vocab), np.float32)),
      argmax_N=np.asarray(argmax, np.int32),
      fed_N=np.asarray(fed, np.int32))


def run_sequence(runtime: Runtime, spec: CacheSpec | None, cache_dtype: str,
                 prompt_T: np.ndarray, num_steps: int,
                 forced_N: Sequence[int] | None = None, *,
                 chunk: int = PREFILL_CHUNK,
                 keep_logits: bool = True) -> Steps:
  """A fresh cache of `spec`, the prompt prefilled in chunks, then
  `step_through` (greedy, or teacher-forced with `forced_N`)."""
  prompt_T = np.asarray(prompt_T, np.int32)
  cache = new_cache(runtime, spec, prompt_T.size + num_steps, cache_dtype)
  first_V, cache = prefill_chunked(runtime, cache, prompt_T, chunk)
  return step_through(runtime, cache, first_V, num_steps, forced_N,
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
