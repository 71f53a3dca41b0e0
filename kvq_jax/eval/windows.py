"""Cutting a token stream into independent evaluation windows."""

from __future__ import annotations

import numpy as np

SCORINGS = ("all", "second_half")


def make_windows(ids, window_len: int, num_windows: int | None) -> np.ndarray:
  """Non-overlapping windows [W, window_len] from the start of `ids`.

  `num_windows=None` (or 0) takes every whole window. Raises ValueError when
  the text is too short for one window or for the windows asked for.
  """
  ids = np.asarray(ids, dtype=np.int32)
  if window_len < 2:
    raise ValueError(f"eval.window_len={window_len}: must be >= 2.")
  available = len(ids) // window_len
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
  return ids[:num_windows * window_len].reshape(num_windows, window_len)


def scored_mask(window_len: int, scoring: str) -> np.ndarray:
  """bool [window_len - 1]: which next-token predictions count.

  Prediction j (logits at position j, target token j + 1) counts for 'all'
  when 0 <= j < window_len - 1, and for 'second_half' when
  j >= window_len // 2, as llama.cpp's perplexity tool does (it scores
  window_len - 1 - window_len // 2 tokens per window).
  """
  if scoring not in SCORINGS:
    raise ValueError(
        f"eval.scoring={scoring!r}: allowed values are {', '.join(SCORINGS)}.")
  first = 0 if scoring == "all" else window_len // 2
  return np.arange(window_len - 1) >= first
