"""Passkey retrieval through a quantized KV cache (`experiments.passkey`).

The standard synthetic task (Mohtashami & Jaggi, "Landmark Attention";
LongLoRA): a task statement, filler text with one 5-digit key stated once at
a given depth, then the question at the end:

  [BOS] There is an important info hidden inside a lot of irrelevant text.
  Find it and memorize them. I will quiz you about the important information
  there. <filler ...> The pass key is 71432. Remember it. 71432 is the pass
  key. <... filler> What is the pass key? The pass key is

Every piece is tokenized on its own and the ids are concatenated; the filler
is cut so that the prompt is exactly `context` tokens (BOS counted when the
tokenizer adds one). Depth d% puts the key sentence before filler token
round(d / 100 * F) of the F filler tokens, moved to the nearest sentence
boundary (a filler token ending in '.', '!', '?' or a newline) when one lies
within `SNAP_TOKENS`; the depth actually used is recorded (`needle_depth`).
Filler: the classic repeated sentences, or consecutive real text (the
evaluation text; key j of a cell starts j * F tokens in, wrapping around).
Keys are fixed: drawn from `numpy.random.default_rng([seed, context, depth,
j])`, so every preset answers the same prompts.

The answer is greedy-decoded (`answer_tokens` tokens) through the cache
under test with the real decode path (`longctx.decoding`: prefill in chunks
of `config.eval.prefill_chunk` tokens, 512 by default, then one
`Runtime.decode` per token); with the sentence filler the filler before
the key is the same in every prompt of a context, so it is prefilled once
per chunk and shared (`decoding.SharedPrefill`, bit-identical to a
prefill from scratch). It is correct when the first run of digits in
the decoded answer is exactly the key. The full-precision baseline runs
first; a cell the baseline fails tells nothing about the cache, and
`summary.md` says so.

Contexts above the model's `max_position_embeddings` are refused. The first
answer token is predicted at the prompt's last position, the later ones at
up to answer_tokens - 2 positions past it (a few positions beyond the
trained range when context = max_position_embeddings).

Outputs in workdir: passkey.csv (one row per preset x context x depth,
baseline rows included), passkey.json (the same plus every sample's key and
answer), passkey_baseline.png and passkey_<preset>.png (accuracy heatmaps,
context x depth, each preset beside the baseline; `longctx/passkey_plot.py`),
summary.md (`longctx/passkey_table.py`, with the CSV's rows), config.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import time
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from kvq_jax.bench.process_memory import peak_rss_gib
from kvq_jax.bench.timing import machine_description
from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import text_ids
from kvq_jax.longctx import decoding
from kvq_jax.longctx.passkey_plot import passkey_plot
from kvq_jax.longctx.passkey_table import cell_rows, summary_markdown
from kvq_jax.models.runtime import Runtime

TASK = ("There is an important info hidden inside a lot of irrelevant text. "
        "Find it and memorize them. I will quiz you about the important "
        "information there.")
FILLER_SENTENCES = (" The grass is green. The sky is blue. The sun is yellow. "
                    "Here we go. There and back again.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
FILLERS = ("sentences", "text")
# Which prompts the presets answer: every one, or only those the baseline
# answers correctly (a prompt the baseline misses tells nothing about the
# cache; skipping it saves its prefill).
PRESETS_ON = ("all", "baseline_correct")
SNAP_TOKENS = 48
_SENTENCE_END = (".", "!", "?", "\n")
_DIGITS = re.compile(r"\d+")


@dataclasses.dataclass(frozen=True)
class PasskeyRequest:
  """What to measure: the grid of contexts x depths and the prompts."""

  contexts: Sequence[int] = (1024, 2048, 4096, 8192)
  depths: Sequence[int] = (0, 25, 50, 75, 100)
  keys_per_cell: int = 5
  filler: str = "sentences"
  answer_tokens: int = 8
  seed: int = 0
  # Tokens per prefill call; None: the config's eval.prefill_chunk.
  prefill_chunk: int | None = None
  presets_on: str = "all"  # One of PRESETS_ON.

  def __post_init__(self):
    if self.presets_on not in PRESETS_ON:
      raise ValueError(f"--presets_on={self.presets_on!r}: allowed: "
                       f"{', '.join(PRESETS_ON)}.")
    object.__setattr__(self, "contexts", decoding.positive_ints(
        self.contexts, "--contexts"))
    depths = tuple(self.depths)
    if not depths or any(isinstance(d, bool) or not isinstance(d, int)
                         or not 0 <= d <= 100 for d in depths):
      raise ValueError(f"--depths={list(depths)!r}: allowed: one or more "
                       "integer percentages in 0..100.")
    object.__setattr__(self, "depths", depths)
    decoding.positive_int(self.keys_per_cell, "--keys_per_cell")
    decoding.positive_int(self.answer_tokens, "--answer_tokens")
    if self.prefill_chunk is not None:
      decoding.positive_int(self.prefill_chunk, "prefill_chunk")
    if self.filler not in FILLERS:
      raise ValueError(f"--filler={self.filler!r}: allowed: "
                       f"{', '.join(FILLERS)}.")


@dataclasses.dataclass(frozen=True, eq=False)
class PasskeyPrompt:
  """One prompt: ids_T (exactly `context` tokens) and where the key is.

  Layout: prefix_len tokens ([BOS] + task), filler_before filler tokens,
  needle_len tokens of the key sentence, the remaining filler tokens
  (filler_len in all), then the question.
  """

  ids_T: np.ndarray
  key: str
  context: int
  depth: int  # Requested, percent of the filler.
  index: int  # Which key of its cell.
  prefix_len: int
  filler_before: int
  filler_len: int
  needle_len: int

  @property
  def needle_start(self) -> int:
    """Token index of the key sentence's first token in ids_T."""
    return self.prefix_len + self.filler_before

  @property
  def needle_depth(self) -> float:
    """Percent of the filler that precedes the key sentence (as built)."""
    if not self.filler_len:
      return 0.0
    return 100.0 * self.filler_before / self.filler_len


def passkey(seed: int, context: int, depth: int, index: int) -> str:
  """The fixed 5-digit key of sample `index` of cell (context, depth)."""
  rng = np.random.default_rng([seed, context, depth, index])
  return str(int(rng.integers(10_000, 100_000)))


def score_answer(answer: str, key: str) -> bool:
  """Exact match: the first run of digits in `answer` is exactly `key`.

  ' 71432.' and '71432 is' match 71432; ' 7143', ' 714320', ' 71 432' and
  an answer without digits do not.
  """
  match = _DIGITS.search(answer)
  return match is not None and match.group() == key


def _encode(tokenizer, text: str) -> np.ndarray:
  return np.asarray(tokenizer.encode(text, add_bos=False), np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class FillerSource:
  """Where filler tokens come from: one repeated unit, or a long text."""

  kind: str  # One of FILLERS.
  ids: np.ndarray  # sentences: the unit's ids; text: the whole text's ids.
  description: str

  def take(self, length: int, index: int) -> np.ndarray:
    """`length` filler tokens for key `index` of a cell.

    sentences: the unit repeated and cut. text: consecutive tokens starting
    index * length tokens in (wrapping around), so the keys of a cell sit
    in different text.
    """
    if self.kind == "sentences":
      return np.resize(self.ids, length).astype(np.int32)
    if self.ids.size < length:
      raise ValueError(
          f"--filler=text: the text ({self.description}) has {self.ids.size} "
          f"tokens, fewer than the {length} filler tokens a prompt needs; "
          "allowed: a longer --eval_data or shorter --contexts.")
    start = (index * length) % (self.ids.size - length + 1)
    return self.ids[start:start + length]


def filler_source(tokenizer, kind: str, eval_data: str | None
                  ) -> FillerSource:
  """The classic sentences, or the evaluation text (`--eval_data`, default
  corpus `eval.corpus.load_eval_text`) tokenized without BOS."""
  if kind == "sentences":
    return FillerSource(kind, _encode(tokenizer, FILLER_SENTENCES),
                        "repeated sentences")
  if kind != "text":
    raise ValueError(f"--filler={kind!r}: allowed: {', '.join(FILLERS)}.")
  text, description = load_eval_text(eval_data)
  ids, _ = text_ids(tokenizer, text)
  return FillerSource(kind, ids, description)


class _SentenceEnds:
  """Per-token-id memo of 'this token ends a sentence'."""

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer
    self._memo: dict[int, bool] = {}

  def __call__(self, ids) -> np.ndarray:
    out = np.zeros(len(ids), bool)
    for i, token in enumerate(np.asarray(ids).tolist()):
      if token not in self._memo:
        piece = self._tokenizer.decode([token]).rstrip(" ")
        self._memo[token] = piece.endswith(_SENTENCE_END)
      out[i] = self._memo[token]
    return out


def needle_offset(ends_F: np.ndarray, depth: int) -> int:
  """Filler tokens before the key sentence for `depth` percent.

  The target round(depth / 100 * F) (half up) moves to the nearest sentence
  boundary (after a token that ends a sentence, or either end of the
  filler) within SNAP_TOKENS; ties go to the earlier one. `ends_F[i]` says
  whether filler token i ends a sentence.
  """
  num = len(ends_F)
  target = int(np.floor(depth * num / 100 + 0.5))
  is_boundary = np.concatenate([[True], np.asarray(ends_F, bool)])
  is_boundary[num] = True  # The end of the filler is a boundary too.
  boundaries = np.flatnonzero(is_boundary)
  distance = np.abs(boundaries - target)
  best = int(boundaries[np.argmin(distance)])  # argmin: the earlier on ties.
  return best if abs(best - target) <= SNAP_TOKENS else target


def build_prompt(tokenizer, filler: FillerSource, context: int, depth: int,
                 key: str, index: int = 0,
                 sentence_ends: _SentenceEnds | None = None) -> PasskeyPrompt:
  """The prompt of one sample, exactly `context` tokens (module docstring)."""
  bos = [tokenizer.bos_id] if tokenizer.add_bos else []
  prefix = np.concatenate([np.asarray(bos, np.int32),
                           _encode(tokenizer, TASK)])
  needle = _encode(tokenizer, NEEDLE.format(key=key))
  question = _encode(tokenizer, QUESTION)
  fixed = prefix.size + needle.size + question.size
  num_filler = context - fixed
  if num_filler < 0:
    raise ValueError(
        f"--contexts={context}: the task, key sentence and question alone "
        f"take {fixed} tokens; allowed: contexts >= {fixed}.")
  filler_F = filler.take(num_filler, index)
  ends = (sentence_ends or _SentenceEnds(tokenizer))(filler_F)
  before = needle_offset(ends, depth)
  ids_T = np.concatenate([prefix, filler_F[:before], needle,
                          filler_F[before:], question]).astype(np.int32)
  if ids_T.size != context:  # Cannot happen; guards the arithmetic above.
    raise AssertionError(f"passkey prompt of {ids_T.size} != {context} "
                         "tokens.")
  return PasskeyPrompt(ids_T=ids_T, key=key, context=context, depth=depth,
                       index=index, prefix_len=prefix.size,
                       filler_before=before, filler_len=num_filler,
                       needle_len=needle.size)


def make_prompts(tokenizer, filler: FillerSource,
                 request: PasskeyRequest) -> list[PasskeyPrompt]:
  """Every sample: contexts x depths x keys_per_cell, in that order."""
  ends = _SentenceEnds(tokenizer)
  return [build_prompt(tokenizer, filler, context, depth,
                       passkey(request.seed, context, depth, j), j, ends)
          for context in request.contexts for depth in request.depths
          for j in range(request.keys_per_cell)]



@dataclasses.dataclass(frozen=True)
class _Answers:
  samples: list[dict]  # In the order of the prompts given.
  chunks_run: int  # Prefill calls made (shared prefixes counted once).


def _answer_all(runtime: Runtime, tokenizer, spec, cache_dtype: str,
                prompts: Sequence[PasskeyPrompt], request: PasskeyRequest,
                progress) -> _Answers:
  """Every prompt's greedy answer through a fresh cache of `spec`.

  Prompts run in (context, needle_start) order through one
  `decoding.SharedPrefill`: the filler before the key is the same for
  every prompt of a context with the sentence filler, so it is prefilled
  once per chunk (bit-identical to prefilling each prompt from scratch).
  """
  prefill = decoding.SharedPrefill(runtime, spec, cache_dtype,
                                   request.prefill_chunk)
  order = sorted(range(len(prompts)), key=lambda i: (
      prompts[i].context, prompts[i].needle_start, i))
  by_index = {}
  for done, i in enumerate(order, 1):
    prompt = prompts[i]
    first_V, cache = prefill.prefill(
        prompt.ids_T, prompt.needle_start,
        prompt.ids_T.size + request.answer_tokens)
    steps = decoding.step_through(runtime, cache, first_V,
                                  request.answer_tokens, keep_logits=False)
    answer = tokenizer.decode(steps.argmax_N.tolist())
    by_index[i] = {
        "context": prompt.context, "depth": prompt.depth,
        "index": prompt.index, "key": prompt.key,
        "needle_start": prompt.needle_start,
        "needle_depth": prompt.needle_depth, "answer": answer,
        "correct": score_answer(answer, prompt.key)}
    progress(done, len(prompts))
  return _Answers([by_index[i] for i in range(len(prompts))],
                  prefill.chunks_run)


@auto_key_stats.resolves_for_run
def run_passkey(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
                request: PasskeyRequest, *,
                points: str | Sequence[str] | None = None,
                eval_data: str | None = None, model: str | None = None,
                name: str = "preset") -> dict:
  """Measures the baseline, then every preset; writes workdir's outputs.

  Args:
    config: the base preset (model, dtype, cache settings of short-spec
      points; its own cache is the one measured when `points` is empty).
    workdir: output directory (created).
    request: contexts, depths, keys and filler.
    points: `--points` (`sweep.points`); None or empty: the preset itself.
    eval_data: text file of `--filler=text` (default corpus when None).
    model: overrides `config.model`.
    name: the preset's display name when `points` is empty.

  Returns:
    {"rows": the CSV rows, "samples": every sample, "info": run facts}.

  Raises:
    ValueError: a context above the model's max_position_embeddings or too
      short for the task, a bad point, or too little filler text.
  """
  started = time.perf_counter()
  model_name = model or config.model
  settings, request, lm = decoding.load_for_request(config, request, model,
                                                    "passkey", points)
  for context in request.contexts:
    lm.config.check_context(context, f"--contexts={context}")
  presets = decoding.resolve_points(settings, name, points, lm.config)
  if request.filler == "sentences" and eval_data:
    logging.warning("passkey: --eval_data is unused with --filler=sentences.")
  filler = filler_source(lm.tokenizer, request.filler, eval_data)
  prompts = make_prompts(lm.tokenizer, filler, request)
  runtime = Runtime(lm.decoder)
  passes = [(decoding.BASELINE, None)] + [(p.name, p.spec) for p in presets]
  logging.info("passkey: %d prompts x %d passes (baseline + %d presets)",
               len(prompts), len(passes), len(presets))
  bar = ProgressBar("passkey")
  samples, chunks_run = [], {}
  for preset, spec in passes:
    todo = prompts
    if preset != decoding.BASELINE and request.presets_on != "all":
      base_ok = {(s["context"], s["depth"], s["index"]) for s in samples
                 if s["preset"] == decoding.BASELINE and s["correct"]}
      todo = [p for p in prompts
              if (p.context, p.depth, p.index) in base_ok]
    mine = _answer_all(runtime, lm.tokenizer, spec, settings.cache_dtype,
                       todo, request, lambda done, n, before=len(samples):
                       bar(before + done, len(passes) * len(prompts)))
    samples += [dict(s, preset=preset) for s in mine.samples]
    chunks_run[preset] = mine.chunks_run
  names = [p for p, _ in passes]
  rows = cell_rows(samples, names)
  info = decoding.run_info(time.perf_counter() - started,
                           machine_description(), peak_rss_gib())
  header = {"model": model_name, "filler": filler.description,
            "eval_data": filler.description if request.filler == "text"
            else None}
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  decoding.write_csv(out / "passkey.csv", rows)
  (out / "passkey.json").write_text(json.dumps({
      **header, **dataclasses.asdict(request), "presets": names,
      "prefill_chunks_run": chunks_run,
      "max_position_embeddings": lm.config.max_position_embeddings,
      **info, "rows": rows, "samples": samples}, indent=2) + "\n")
  title = f"{model_name}: passkey accuracy ({filler.description})"
  passkey_plot(out / "passkey_baseline.png", rows, [decoding.BASELINE],
               request, title)
  for preset in names[1:]:
    passkey_plot(out / f"passkey_{decoding.file_stem(preset)}.png", rows,
                 [decoding.BASELINE, preset], request, title)
  summary = summary_markdown(rows, names, request, header, info)
  (out / "summary.md").write_text(summary)
  (out / "config.json").write_text(
      decoding.resolved_config_json(config, model_name))
  print(summary)
  return {"rows": rows, "samples": samples, "info": info}
