"""Decode-heavy agreement of a quantized cache with the baseline
(`experiments.agreement`).

Prompts are consecutive non-overlapping slices of the tokenized evaluation
text, `prefix_len` tokens each (BOS first where the tokenizer wants one:
`eval.windows.text_ids` / `make_windows`). For every prompt:

1. The baseline (full-precision cache) prefills the prompt in chunks of
   `config.eval.prefill_chunk` tokens (512) and greedy-decodes `new_tokens`
   tokens, one `Runtime.decode` per token (`longctx.decoding`), keeping the
   next-token logits of every step. Prompts run in batches of
   `batch_size` (16: one batch of the default 16 prompts), the same batches
   for every cache, so a decode step reads the weights once per batch.
2. Every preset prefills the same prompt into its own quantized cache and
   is then **teacher-forced** along the baseline's continuation: step i
   feeds the baseline's token i into the preset's cache, whatever the
   preset would have chosen, so at every step both caches hold the same
   token prefix and the two next-token distributions are directly
   comparable. KL(baseline || preset) and top-1 agreement per step come from
   `eval.token_metrics.compare_logits`.
3. The preset's own greedy continuation equals the forced one for as long
   as its argmax equals the baseline's token (same tokens fed, same
   deterministic program), so the first step whose argmax differs is
   exactly where a free-running greedy decode would first diverge: tokens
   until first divergence (`new_tokens` when none) and whether the whole
   continuation is identical come from the same pass, no second decode.

Reported per (preset, prefix_len), with stderr over prompts
(`eval.paired.window_mean`, a prompt being the cluster): mean tokens until
first divergence, fraction of identical continuations, mean per-step KL and
top-1 agreement, and the KL over step ranges 1-16, 17-64, 65-128 (clipped
to `new_tokens`; 129-N added beyond 128) to show how the error grows with
the decode length. End-of-sequence tokens do not stop a continuation.

Outputs in workdir: agreement.csv (one row per preset x prefix_len),
agreement.json (the rows, the mean KL of every step, each prompt's first
divergence and the baseline's continuations), summary.md, config.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Callable, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from kvq_jax.bench.process_memory import peak_rss_gib
from kvq_jax.bench.timing import machine_description
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.paired import window_mean
from kvq_jax.eval.token_metrics import compare_logits
from kvq_jax.eval.uncertainty_format import format_mean_stderr
from kvq_jax.eval.windows import make_windows, text_ids, text_per_window
from kvq_jax.longctx import decoding
from kvq_jax.models.runtime import Runtime

STEP_RANGES = ((1, 16), (17, 64), (65, 128))


@dataclasses.dataclass(frozen=True)
class AgreementRequest:
  """How many prompts, how long, and how many tokens to decode."""

  num_prompts: int = 16
  prefix_lens: Sequence[int] = (256, 1024, 4096)
  new_tokens: int = 128
  # Tokens per prefill call; None: the config's eval.prefill_chunk.
  prefill_chunk: int | None = None
  # Prompts prefilled and decoded together (the same batches for the
  # baseline and every preset).
  batch_size: int = 16

  def __post_init__(self):
    decoding.positive_int(self.num_prompts, "--num_prompts")
    decoding.positive_int(self.batch_size, "--batch_size")
    object.__setattr__(self, "prefix_lens", decoding.positive_ints(
        self.prefix_lens, "--prefix_lens"))
    decoding.positive_int(self.new_tokens, "--new_tokens")
    if self.prefill_chunk is not None:
      decoding.positive_int(self.prefill_chunk, "prefill_chunk")


def step_ranges(new_tokens: int) -> list[tuple[int, int]]:
  """STEP_RANGES clipped to 1..new_tokens (1-based, inclusive), plus
  129..new_tokens when it is longer."""
  ranges = [(lo, min(hi, new_tokens)) for lo, hi in STEP_RANGES
            if lo <= new_tokens]
  last = STEP_RANGES[-1][1]
  if new_tokens > last:
    ranges.append((last + 1, new_tokens))
  return ranges


@dataclasses.dataclass(frozen=True, eq=False)
class PromptComparison:
  """One prompt, one preset, against the baseline.

  first_divergence: identical tokens before the preset's greedy choice first
  differs (new_tokens: never). kl_N, top1_N: per step, teacher-forced.
  """

  first_divergence: int
  kl_N: np.ndarray
  top1_N: np.ndarray

  @property
  def identical(self) -> bool:
    return self.first_divergence == self.kl_N.size


def compare_steps(base: decoding.Steps, forced: decoding.Steps,
                  last_prompt_token: int) -> PromptComparison:
  """A preset's teacher-forced steps against the baseline's greedy steps.

  Step i's logits predict the baseline's token i; `compare_logits` scores
  position t's logits against token t + 1, so the sequence handed to it is
  [last prompt token, b_1 .. b_N] with the logits of the N steps and one
  unused row appended.
  """
  n = base.argmax_N.size
  if (forced.logits_NxV.shape != base.logits_NxV.shape
      or forced.argmax_N.size != n):
    raise ValueError(
        f"compare_steps: baseline logits {base.logits_NxV.shape}, preset "
        f"{forced.logits_NxV.shape}; allowed: the same [steps, vocab].")
  tokens_1xT = np.concatenate([[last_prompt_token], base.argmax_N])[None]
  pad_1xV = np.zeros((1, base.logits_NxV.shape[1]), np.float32)
  metrics = compare_logits(
      jnp.asarray(np.concatenate([base.logits_NxV, pad_1xV])[None]),
      jnp.asarray(np.concatenate([forced.logits_NxV, pad_1xV])[None]),
      jnp.asarray(tokens_1xT, jnp.int32))
  differs = np.flatnonzero(forced.argmax_N != base.argmax_N)
  return PromptComparison(
      first_divergence=int(differs[0]) if differs.size else n,
      kl_N=np.asarray(metrics["kl"][0], np.float64),
      top1_N=np.asarray(metrics["top1"][0], np.float64))


def prompts_for(ids, bos_id: int | None, request: AgreementRequest
                ) -> dict[int, np.ndarray]:
  """prefix_len -> prompts [num_prompts, prefix_len] from the text's start."""
  out = {}
  for length in request.prefix_lens:
    per_prompt = text_per_window(length, bos_id)
    need = request.num_prompts * per_prompt
    if per_prompt < 1 or len(ids) < need:
      raise ValueError(
          f"--num_prompts={request.num_prompts} x --prefix_lens={length}: "
          f"needs {need} text tokens, the evaluation text has {len(ids)}; "
          "allowed: fewer or shorter prompts, or a longer --eval_data.")
    out[length] = make_windows(ids, length, request.num_prompts, bos_id)
  return out


def measure(runtime: Runtime, prompts: dict[int, np.ndarray],
            presets: Sequence[tuple[str, CacheSpec | None]], cache_dtype: str,
            request: AgreementRequest,
            progress: Callable[[int, int], None] | None = None
            ) -> tuple[dict[tuple[str, int], list[PromptComparison]],
                       dict[int, list[np.ndarray]]]:
  """Baseline greedy decode, then every preset teacher-forced, per batch of
  `request.batch_size` prompts.

  Returns ({(preset, prefix_len): one comparison per prompt},
  {prefix_len: the baseline's continuations}). A preset with spec None is
  the full-precision cache again (a self-check: KL 0, no divergence).
  """
  results = {(name, length): [] for name, _ in presets
             for length in prompts}
  continuations = {length: [] for length in prompts}
  chunk = request.prefill_chunk or decoding.PREFILL_CHUNK
  total = sum(p.shape[0] for p in prompts.values()) * (1 + len(presets))
  done = 0
  for length, prompts_PxT in prompts.items():
    for start in range(0, prompts_PxT.shape[0], request.batch_size):
      batch_BxT = prompts_PxT[start:start + request.batch_size]
      base = decoding.run_rows(runtime, None, cache_dtype, batch_BxT,
                               request.new_tokens, chunk=chunk)
      continuations[length] += [steps.argmax_N for steps in base]
      done += len(base)
      if progress:
        progress(done, total)
      forced_BxN = np.stack([steps.argmax_N[:-1] for steps in base])
      for name, spec in presets:
        forced = decoding.run_rows(runtime, spec, cache_dtype, batch_BxT,
                                   request.new_tokens, forced_BxN,
                                   chunk=chunk)
        results[(name, length)] += [
            compare_steps(b, f, int(prompt_T[-1]))
            for b, f, prompt_T in zip(base, forced, batch_BxT)]
        done += len(base)
        if progress:
          progress(done, total)
  return results, continuations


def _stat(values_PxN: np.ndarray) -> tuple[float, float]:
  m = window_mean(values_PxN)
  return m.mean, m.stderr


def aggregate(name: str, prefix_len: int,
              comparisons: Sequence[PromptComparison],
              new_tokens: int) -> dict:
  """One CSV row: means over prompts with their stderr (NaN for one)."""
  kl_PxN = np.stack([c.kl_N for c in comparisons])
  top1_PxN = np.stack([c.top1_N for c in comparisons])
  divergence_Px1 = np.asarray([[c.first_divergence] for c in comparisons],
                              np.float64)
  identical_Px1 = np.asarray([[c.identical] for c in comparisons],
                             np.float64)
  row = {"preset": name, "prefix_len": prefix_len,
         "num_prompts": len(comparisons), "new_tokens": new_tokens}
  for key, values in (("first_divergence", divergence_Px1),
                      ("identical_fraction", identical_Px1),
                      ("kl", kl_PxN), ("top1_agreement", top1_PxN)):
    row[f"{key}_mean"], row[f"{key}_stderr"] = _stat(values)
  for lo, hi in step_ranges(new_tokens):
    row[f"kl_steps_{lo}_{hi}_mean"], row[f"kl_steps_{lo}_{hi}_stderr"] = (
        _stat(kl_PxN[:, lo - 1:hi]))
  return row


def _fmt(row: dict, key: str) -> str:
  return format_mean_stderr(row[f"{key}_mean"], row[f"{key}_stderr"])


def summary_markdown(rows: Sequence[dict], header: dict, info: dict,
                     request: AgreementRequest) -> str:
  """summary.md: one line per preset x prefix length."""
  ranges = step_ranges(request.new_tokens)
  columns = (["preset", "prefix", "tokens to 1st divergence",
              "identical", "KL mean"]
             + [f"KL steps {lo}-{hi}" for lo, hi in ranges] + ["top-1"])
  lines = [
      f"# Decode agreement: {header['model']}", "",
      f"{request.num_prompts} prompts per prefix length from "
      f"{header['eval_data']}, {request.new_tokens} greedy tokens each "
      "(prefill in chunks of "
      f"{request.prefill_chunk}, then one decode step per token; "
      f"batches of {request.batch_size} prompts). KL is "
      "KL(baseline || preset) in nats per step, the preset teacher-forced "
      "along the baseline's continuation; divergence counts the identical "
      f"tokens before the preset's greedy choice first differs "
      f"({request.new_tokens} = never). Mean ± stderr over prompts.", ""]
  lines += decoding.info_lines(info)
  lines += ["", "| " + " | ".join(columns) + " |",
            "|---|---:|" + "---:|" * (len(columns) - 2)]
  for r in rows:
    cells = [r["preset"], str(r["prefix_len"]),
             _fmt(r, "first_divergence"), _fmt(r, "identical_fraction"),
             _fmt(r, "kl")]
    cells += [_fmt(r, f"kl_steps_{lo}_{hi}") for lo, hi in ranges]
    cells.append(_fmt(r, "top1_agreement"))
    lines.append("| " + " | ".join(cells) + " |")
  if not rows:
    lines.append("(no preset: baseline only)")
  return "\n".join(lines) + "\n"


@auto_key_stats.resolves_for_run
def run_agreement(config: ml_collections.ConfigDict,
                  workdir: str | os.PathLike, request: AgreementRequest, *,
                  points: str | Sequence[str] | None = None,
                  eval_data: str | None = None, model: str | None = None,
                  name: str = "preset") -> dict:
  """Measures every preset against one baseline pass; writes workdir.

  Args:
    config: the base preset (model, dtype, cache settings of short-spec
      points; its own cache is the one measured when `points` is empty).
    workdir: output directory (created).
    request: prompts, prefix lengths and decode length.
    points: `--points` (`sweep.points`); None or empty: the preset itself.
    eval_data: the text prompts are cut from (default corpus when None).
    model: overrides `config.model`.
    name: the preset's display name when `points` is empty.

  Returns:
    {"rows": the CSV rows, "info": run facts}.

  Raises:
    ValueError: prefix_len + new_tokens - 1 above the model's
      max_position_embeddings, too little text, or a bad point.
  """
  started = time.perf_counter()
  model_name = model or config.model
  settings, request, lm = decoding.load_for_request(config, request, model,
                                                    "agreement", points)
  for length in request.prefix_lens:
    # The cache ends up holding the prompt and all but the last new token.
    lm.config.check_context(
        length + request.new_tokens - 1,
        f"--prefix_lens={length} with --new_tokens={request.new_tokens}")
  presets = decoding.resolve_points(settings, name, points, lm.config)
  if not presets:
    logging.warning("agreement: no preset to compare; the baseline alone "
                    "is decoded.")
  text, description = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  prompts = prompts_for(ids, bos_id, request)
  runtime = Runtime(lm.decoder)
  results, continuations = measure(
      runtime, prompts, [(p.name, p.spec) for p in presets],
      settings.cache_dtype, request, progress=ProgressBar("agreement"))
  rows = [aggregate(p.name, length, results[(p.name, length)],
                    request.new_tokens)
          for p in presets for length in request.prefix_lens]
  info = decoding.run_info(time.perf_counter() - started,
                           machine_description(), peak_rss_gib())
  header = {"model": model_name, "eval_data": description}
  per_step = {
      f"{p.name}@{length}": {
          "kl_by_step": np.mean([c.kl_N for c in results[(p.name, length)]],
                                axis=0).tolist(),
          "first_divergence": [c.first_divergence
                               for c in results[(p.name, length)]]}
      for p in presets for length in request.prefix_lens}
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  decoding.write_csv(out / "agreement.csv", rows)
  (out / "agreement.json").write_text(json.dumps({
      **header, **dataclasses.asdict(request),
      "presets": [p.name for p in presets], **info, "rows": rows,
      "per_step": per_step,
      "baseline_continuations": {
          str(length): [lm.tokenizer.decode(c.tolist()) for c in conts]
          for length, conts in continuations.items()}}, indent=2) + "\n")
  summary = summary_markdown(rows, header, info, request)
  (out / "summary.md").write_text(summary)
  (out / "config.json").write_text(
      decoding.resolved_config_json(config, model_name))
  print(summary)
  return {"rows": rows, "info": info}

