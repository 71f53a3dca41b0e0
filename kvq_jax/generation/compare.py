"""See what a preset does to text: greedy continuations under several caches.

The computation behind `experiments.generate` (`generation.runner.run`; the
text report is `generation.report`). One prompt is greedy-decoded once per
cache kind -- the full-precision baseline (a dense cache in the compute
dtype, as `experiments.run` compares against), the `--config` preset's cache
and any `--compare` kinds -- through the real serving path:
`models.generate.generate`, i.e. the jitted prefill of the whole prompt into
the cache object (`cache.factory.init_cache`: dense or quantized, the same
classes the evaluation uses) and then one jitted decode step per new token,
each reading the cache the previous one wrote.

Per kind it reports the new tokens, the first token where they differ from
the baseline (`first_divergence`), tokens/s and the cache's bytes:

* every cache of one prompt gets the same slots (`equal_slots` of
  `generate`'s default capacity over every spec's block size), so the bytes
  compare like for like; `cache_bytes` sums every leaf of that cache
  (packed codes, scales, zeros, full-precision windows and sinks, lengths),
  read off the pytree `init_cache` builds (`jax.eval_shape`: exactly the
  shapes the decode ran with);
* `bits_per_element` is the effective bits per K/V element at the tokens the
  sequence holds (`capacity.memory.effective_bits`);
* tokens/s = new tokens / wall seconds of one `generate` call (prompt
  prefill included) after a short warm-up call with the same prompt length,
  capacity and cache kind, so compilation is not timed.

Decoding stops at the end-of-sequence token (with `chat`, the template's
end-of-turn token) or after `max_new_tokens`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import jax

from kvq_jax.bench.decode_bench import leaf_bytes
from kvq_jax.bench.decode_speed import equal_slots
from kvq_jax.cache.factory import init_cache
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.models.generate import default_capacity, generate
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.experiment_settings import ExperimentSettings
from kvq_jax.settings.kinds import Kind, resolve_kind

BASELINE = "baseline"


@dataclasses.dataclass(frozen=True)
class Continuation:
  """One kind's greedy continuation and what it cost."""

  kind: Kind  # 'baseline', the --config preset or a --compare kind.
  new_ids: tuple[int, ...]  # Includes the stop token if one ended it.
  seconds: float  # Wall time of the compiled generate call.
  cache_bytes: int  # Every leaf of the cache (`capacity` slots).
  bits_per_element: float  # Effective, at the tokens the sequence holds.

  @property
  def tokens_per_s(self) -> float:
    return len(self.new_ids) / self.seconds if self.seconds > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class PromptComparison:
  """Every kind's continuation of one prompt; the baseline's first."""

  prompt: str | None  # The text as given (None when ids were given).
  prompt_ids: tuple[int, ...]  # What was prefilled (chat template applied).
  chat_family: str | None  # The template family applied, or None.
  stop_id: int | None  # Decoding stopped after emitting it.
  max_new_tokens: int
  capacity: int  # Slots of every cache.
  continuations: tuple[Continuation, ...]


def first_divergence(reference: Sequence[int],
                     other: Sequence[int]) -> int | None:
  """The first index where `other` differs from `reference`; None when they
  are identical. A sequence that ends first differs where it ends."""
  for i, (a, b) in enumerate(zip(reference, other)):
    if a != b:
      return i
  if len(reference) != len(other):
    return min(len(reference), len(other))
  return None


def positive(value: int, what: str) -> int:
  """`value` if it is an int >= 1, else ValueError naming `what`."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{what}={value!r}: allowed: an integer >= 1.")
  return value


def cache_kinds(settings: ExperimentSettings, config_name: str,
                compare: Sequence[str] = ()) -> list[Kind]:
  """The baseline, the preset's cache (when it quantizes) and every
  `compare` kind (`settings.kinds.resolve_kind`: 'bf16', 'float32', a
  preset name / file or a short spec); ValueError for an unknown or
  repeated name."""
  kinds = [Kind(BASELINE, None, settings.dtype)]
  if settings.quantize:
    kinds.append(Kind(config_name, settings.cache_spec,
                      settings.cache_dtype))
  kinds += [resolve_kind(name) for name in compare]
  names = [k.name for k in kinds]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise ValueError(
        f"--compare: {', '.join(repeated)} given twice (the --config preset "
        f"is {config_name!r}, the full-precision cache is {BASELINE!r}); "
        "allowed: each kind once.")
  return kinds


def _cache_bytes(runtime: Runtime, kind: Kind, capacity: int) -> int:
  return leaf_bytes(jax.eval_shape(lambda: init_cache(
      runtime.config, 1, capacity, kind.spec, kind.dtype)))


def continue_prompt(runtime: Runtime, prompt_ids: Sequence[int],
                    kinds: Sequence[Kind], max_new_tokens: int,
                    stop_id: int | None = None
                    ) -> tuple[int, tuple[Continuation, ...]]:
  """(the slots every cache got, one greedy `Continuation` per kind).

  `stop_id` None stops at the model's `eos_token_id`.
  """
  positive(max_new_tokens, "max_new_tokens")
  prompt = [int(t) for t in prompt_ids]
  if not prompt:
    raise ValueError("continue_prompt: the prompt is empty; allowed: >= 1 "
                     "token.")
  capacity = equal_slots(default_capacity(len(prompt), max_new_tokens),
                         [k.spec for k in kinds])
  out = []
  for kind in kinds:
    run = lambda n, kind=kind: generate(  # noqa: E731
        runtime, None, prompt, n, eos_id=stop_id,
        cache_dtype=kind.dtype, cache_spec=kind.spec, capacity=capacity)
    run(min(2, max_new_tokens))  # Compiles prefill and the decode step.
    start = time.perf_counter()
    new_ids = run(max_new_tokens).new_ids
    seconds = time.perf_counter() - start
    out.append(Continuation(
        kind=kind, new_ids=new_ids, seconds=seconds,
        cache_bytes=_cache_bytes(runtime, kind, capacity),
        bits_per_element=effective_bits(runtime.config, kind.spec,
                                        kind.dtype,
                                        len(prompt) + len(new_ids))))
  return capacity, tuple(out)
