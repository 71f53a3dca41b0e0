"""Calibration windows from the end of the text, evaluation from the start."""

from __future__ import annotations

import dataclasses

import numpy as np

from kvq_jax.eval.windows import make_windows, text_per_window


@dataclasses.dataclass(frozen=True)
class WindowSplit:
  """Token ranges [start, stop) of the ids both window sets come from."""

  eval_WxT: np.ndarray
  calib_WxT: np.ndarray
  eval_range: tuple[int, int]
  calib_range: tuple[int, int]


def assert_disjoint(a: tuple[int, int], b: tuple[int, int]) -> None:
  if max(a[0], b[0]) < min(a[1], b[1]):
    raise ValueError(f"calibration tokens {b} overlap evaluation tokens {a}.")


def split_windows(ids, window_len: int, num_eval: int,
                  num_calib: int, bos_id: int | None = None) -> WindowSplit:
  """Eval windows = the first `num_eval` windows (`make_windows`, 0 = every
  whole window before the calibration tokens); calibration windows = the
  last `num_calib` windows' text tokens. With `bos_id` every window is BOS +
  window_len - 1 text tokens (ranges count text tokens). Raises ValueError
  if they overlap."""
  ids = np.asarray(ids, np.int32)
  full_len, window_len = window_len, text_per_window(window_len, bos_id)
  if isinstance(num_calib, bool) or not isinstance(num_calib, int) or (
      num_calib < 1):
    raise ValueError(f"num_calib_windows={num_calib!r}: allowed: >= 1.")
  calib_start = len(ids) - num_calib * window_len
  if calib_start < window_len:
    raise ValueError(
        f"the text has {len(ids)} tokens: {num_calib} calibration windows of "
        f"{window_len} leave no room for an evaluation window before them.")
  if num_eval == 0:
    num_eval = calib_start // window_len
  if num_eval * window_len > calib_start:
    raise ValueError(
        f"eval.num_windows={num_eval} windows of {window_len} need tokens "
        f"[0, {num_eval * window_len}), which overlap the {num_calib} "
        f"calibration windows at [{calib_start}, {len(ids)}); allowed: "
        f"num_windows <= {calib_start // window_len}, or fewer calibration "
        "windows, or a longer text.")
  eval_wxt = make_windows(ids[:calib_start], full_len, num_eval, bos_id)
  eval_range = (0, num_eval * window_len)
  calib_range = (calib_start, len(ids))
  assert_disjoint(eval_range, calib_range)
  return WindowSplit(
      eval_WxT=eval_wxt,
      calib_WxT=make_windows(ids[calib_start:], full_len, num_calib, bos_id),
      eval_range=eval_range, calib_range=calib_range)
