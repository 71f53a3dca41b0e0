"""Cutting a token stream into independent evaluation windows."""

from __future__ import annotations

import re

import numpy as np

SCORINGS = ("all", "second_half")  # Plus last_N (`check_scoring`).
_LAST = re.compile(r"^last_(?P<n>\d+)$")


def text_ids(tokenizer, text: str) -> tuple[np.ndarray, int | None]:
  """(ids of `text` without BOS, the BOS id every window starts with or None).

  A tokenizer whose model expects BOS (`add_bos`, e.g. Gemma 3) gets it at
  the start of every window, as llama.cpp's perplexity tool does; the text
  ids themselves never contain it.
  """
  ids = np.asarray(tokenizer.encode(text, add_bos=False), np.int32)
  return ids, (tokenizer.bos_id if tokenizer.add_bos else None)


def text_per_window(window_len: int, bos_id: int | None) -> int:
  """Text tokens in one window: window_len, or window_len - 1 after a BOS."""
  return window_len - (bos_id is not None)


def make_windows(ids, window_len: int, num_windows: int | None,
                 bos_id: int | None = None) -> np.ndarray:
  """Non-overlapping windows [W, window_len] from the start of `ids`.

  With `bos_id`, each window is BOS followed by the next window_len - 1
  text tokens (consecutive, non-overlapping). `num_windows=None` (or 0)
  takes every whole window. Raises ValueError when the text is too short
  for one window or for the windows asked for.
  """
  ids = np.asarray(ids, dtype=np.int32)
  if window_len < 2:
    raise ValueError(f"eval.window_len={window_len}: must be >= 2.")
  stride = text_per_window(window_len, bos_id)
  available = len(ids) // stride
  if available == 0:
    raise ValueError(
        f"evaluation text has {len(ids)} tokens, fewer than one window of "
        f"eval.window_len={window_len}; use a longer --eval_data or a smaller "
        "window.")
  if num_windows is None or num_windows == 0:
    num_windows = available
  if num_windows < 0 or num_windows > available:
    raise ValueError(
        f"eval.num_windows={num_windows}: the text holds {available} windows "
        f"of {window_len} tokens ({len(ids)} tokens); allowed 1..{available} "
        "(or 0 for all).")
  windows = ids[:num_windows * stride].reshape(num_windows, stride)
  if bos_id is not None:
    windows = np.concatenate(
        [np.full((num_windows, 1), bos_id, np.int32), windows], axis=1)
  return windows


def check_scoring(scoring: str) -> int | None:
  """Validates an `eval.scoring` name; returns N of 'last_N', else None.

  Allowed: 'all', 'second_half' (llama.cpp's rule) and 'last_N' with an
  integer N >= 1 (e.g. 'last_256': the last N predictions of every window,
  the same number at every window length, as `experiments.context_curve`
  scores).
  """
  match = _LAST.match(scoring) if isinstance(scoring, str) else None
  if match:
    n = int(match["n"])
    if n >= 1:
      return n
  elif scoring in SCORINGS:
    return None
  raise ValueError(
      f"eval.scoring={scoring!r}: allowed values are {', '.join(SCORINGS)}, "
      "last_N (N >= 1, e.g. last_256).")


def scored_mask(window_len: int, scoring: str) -> np.ndarray:
  """bool [window_len - 1]: which next-token predictions count.

  Prediction j (logits at position j, target token j + 1) counts for 'all'
  when 0 <= j < window_len - 1, and for 'second_half' when
  j >= window_len // 2, as llama.cpp's perplexity tool does (it scores
  window_len - 1 - window_len // 2 tokens per window). 'last_N' counts the
  last N predictions, j >= window_len - 1 - N; it needs N <= window_len - 1
  (ValueError otherwise, so a short window never silently scores fewer).
  """
  last = check_scoring(scoring)
  if last is not None:
    if last > window_len - 1:
      raise ValueError(
          f"eval.scoring={scoring!r} needs windows of at least {last + 1} "
          f"tokens ({last} predictions); got window_len={window_len}. "
          f"Allowed: last_N with N <= {window_len - 1}, or a longer window.")
    first = window_len - 1 - last
  else:
    first = 0 if scoring == "all" else window_len // 2
  return np.arange(window_len - 1) >= first


def logits_needed(mask_T) -> int:
  """K: the logits of a window's last K positions cover every scored
  prediction of `mask_T` [window_len - 1] (K = window_len - the first
  scored j). A forward that returns only those (e.g.
  `facade.chunked_window_forward(keep=K)`) saves the rest of the
  [window_len, vocab] logits: `evaluate_many(..., tail=K)`. ValueError when
  nothing is scored.
  """
  mask_T = np.asarray(mask_T, bool)
  if mask_T.ndim != 1 or not mask_T.any():
    raise ValueError(f"logits_needed: mask of shape {mask_T.shape} with "
                     f"{int(mask_T.sum())} scored predictions; allowed: a "
                     "1-D mask scoring at least one prediction.")
  return mask_T.size + 1 - int(np.argmax(mask_T))
