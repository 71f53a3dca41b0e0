"""The text report of `generation.compare`: continuations one after another.

For one prompt: a header (prompt, tokens prefilled, stop token, slots), then
one labelled section per cache kind -- new tokens, tokens/s, cache bytes and
effective bits, and for every kind but the baseline the first token where it
leaves the baseline's continuation (index and both tokens), marked `MARK` in
its text -- and a table of the same numbers.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvq_jax.generation.compare import (BASELINE, Continuation,
                                        PromptComparison, first_divergence)
from kvq_jax.settings.kinds import Kind

MARK = "‖"  # Inserted where a continuation leaves the baseline's.


def _text(tokenizer: Any | None, ids: Sequence[int]) -> str:
  if tokenizer is None:
    return " ".join(str(i) for i in ids)
  return tokenizer.decode(list(ids))


def _describe(kind: Kind) -> str:
  if kind.spec is None:
    return f"dense {kind.dtype} cache"
  return f"quantized cache (from {kind.dtype})"


def _token(tokenizer: Any | None, ids: Sequence[int], index: int) -> str:
  if index >= len(ids):
    return "(ended)"
  if tokenizer is None:
    return f"id {ids[index]}"
  return f"{tokenizer.decode([ids[index]])!r} (id {ids[index]})"


def _divergence_line(tokenizer: Any | None, base: Continuation,
                     other: Continuation, index: int | None) -> str:
  if index is None:
    return "identical to the baseline"
  return (f"first divergence at token {index} (marked {MARK} below): "
          f"{BASELINE} {_token(tokenizer, base.new_ids, index)}, "
          f"{other.kind.name} {_token(tokenizer, other.new_ids, index)}")


def _numbers(c: Continuation, base: Continuation, held: int) -> str:
  ratio = ("" if c is base
           else f" = {c.cache_bytes / base.cache_bytes:.3f} x {BASELINE}")
  return (f"{len(c.new_ids)} new tokens, {c.tokens_per_s:.1f} tokens/s, "
          f"cache {c.cache_bytes:,} bytes{ratio} "
          f"({c.bits_per_element:.2f} bits/element at {held} tokens)")


def format_comparison(comparison: PromptComparison,
                      tokenizer: Any | None = None, header: str = "Prompt"
                      ) -> str:
  """The report of one prompt (module docstring); `tokenizer` None shows
  token ids instead of text."""
  base = comparison.continuations[0]
  prompt = (repr(comparison.prompt) if comparison.prompt is not None
            else _text(None, comparison.prompt_ids))
  chat = (f", {comparison.chat_family} chat template applied"
          if comparison.chat_family else "")
  stop = ("no stop token" if comparison.stop_id is None else
          f"stop after {_token(tokenizer, [comparison.stop_id], 0)}")
  lines = [f"=== {header} ===",
           f"prompt: {prompt}",
           f"prefilled {len(comparison.prompt_ids)} tokens{chat}; greedy, "
           f"at most {comparison.max_new_tokens} new tokens, {stop}",
           f"every cache has {comparison.capacity} slots; tokens/s = new "
           "tokens / wall time of one compiled generate call (prefill "
           "included)"]
  rows = []
  for c in comparison.continuations:
    held = len(comparison.prompt_ids) + len(c.new_ids)
    index = None if c is base else first_divergence(base.new_ids, c.new_ids)
    lines += ["", f"--- {c.kind.name}: {_describe(c.kind)} ---",
              _numbers(c, base, held)]
    text = _text(tokenizer, c.new_ids)
    if c is not base:
      lines.append(_divergence_line(tokenizer, base, c, index))
      if index is not None:
        sep = "" if tokenizer is not None else " "
        text = (_text(tokenizer, c.new_ids[:index]) + sep + MARK + sep
                + _text(tokenizer, c.new_ids[index:]))
    lines.append(text)
    rows.append(
        f"| {c.kind.name} | {len(c.new_ids)} | "
        f"{'-' if c is base else 'none' if index is None else index} | "
        f"{c.tokens_per_s:.1f} | {c.cache_bytes:,} | "
        f"{c.cache_bytes / base.cache_bytes:.3f} | "
        f"{c.bits_per_element:.2f} |")
  lines += ["", "| cache | new tokens | first divergence | tokens/s | "
            "cache bytes | x baseline | bits/element |",
            "|---|---|---|---|---|---|---|"] + rows
  return "\n".join(lines) + "\n"
