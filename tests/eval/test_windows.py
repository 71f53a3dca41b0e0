"""make_windows / scored_mask: shapes, order, llama.cpp's second_half count."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax.eval.windows import make_windows, scored_mask, text_ids


def test_windows_are_consecutive_from_the_start():
  windows = make_windows(list(range(100)), 10, 3)
  assert windows.shape == (3, 10) and windows.dtype == np.int32
  np.testing.assert_array_equal(windows, np.arange(30).reshape(3, 10))


@pytest.mark.parametrize("num_windows", [0, None])
def test_zero_or_none_takes_every_whole_window(num_windows):
  windows = make_windows(np.arange(105), 10, num_windows)
  assert windows.shape == (10, 10)
  assert windows[-1, -1] == 99  # The partial tail (100..104) is dropped.


def test_too_short_text_names_window_len():
  with pytest.raises(ValueError, match=r"eval\.window_len=10"):
    make_windows(np.arange(9), 10, 1)


@pytest.mark.parametrize("num_windows", [11, -1])
def test_too_many_windows_lists_allowed_range(num_windows):
  with pytest.raises(ValueError, match=r"allowed 1\.\.10 \(or 0 for all\)"):
    make_windows(np.arange(100), 10, num_windows)


def test_window_len_below_two_rejected():
  with pytest.raises(ValueError, match=r"window_len=1: must be >= 2"):
    make_windows(np.arange(10), 1, 1)


def test_scored_mask_counts_match_llama_cpp():
  second = scored_mask(512, "second_half")
  assert second.shape == (511,)
  assert int(second.sum()) == 255  # llama.cpp: n_ctx - 1 - n_ctx / 2.
  assert not second[255] and second[256] and second[-1]
  assert int(scored_mask(512, "all").sum()) == 511
  assert int(scored_mask(7, "second_half").sum()) == 7 - 1 - 7 // 2


def test_bad_scoring_lists_allowed_values():
  with pytest.raises(ValueError, match=r"eval\.scoring='half'.*all, second_half"):
    scored_mask(16, "half")


def test_bos_starts_every_window_then_consecutive_text():
  windows = make_windows(np.arange(10, 30), 5, 0, bos_id=1)
  # 4 text tokens per window after the BOS: 20 tokens -> 5 windows.
  assert windows.tolist() == [[1, 10, 11, 12, 13], [1, 14, 15, 16, 17],
                              [1, 18, 19, 20, 21], [1, 22, 23, 24, 25],
                              [1, 26, 27, 28, 29]]


class _Tok:

  def __init__(self, add_bos):
    self.add_bos, self.bos_id = add_bos, 7

  def encode(self, text, add_bos=None):
    ids = [ord(c) for c in text]
    return [self.bos_id] + ids if (self.add_bos if add_bos is None
                                   else add_bos) else ids


@pytest.mark.parametrize("add_bos", [True, False])
def test_text_ids_never_hold_bos_and_report_it(add_bos):
  ids, bos = text_ids(_Tok(add_bos), "abc")
  assert ids.tolist() == [97, 98, 99]
  assert bos == (7 if add_bos else None)
