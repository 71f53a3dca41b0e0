"""The pinned-perplexity check every real-checkpoint test shares."""

from __future__ import annotations

import pathlib

import pytest

from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.evaluate import evaluate_windows
from kvq_jax.eval.windows import make_windows, scored_mask, text_ids
from kvq_jax.facade import window_forward

WIKITEXT = (pathlib.Path(__file__).resolve().parents[1].parent / "shared" /
            "data" / "wikitext-2-raw" / "wiki.test.raw")


def first_windows(model, num_windows: int = 4, window_len: int = 512):
  """The first WikiText-2 test windows as `experiments.run` cuts them."""
  if not WIKITEXT.is_file():
    pytest.skip(f"{WIKITEXT} is missing; the pinned value is WikiText-2's.")
  text, _ = load_eval_text(str(WIKITEXT))
  ids, bos = text_ids(model.tokenizer, text)
  return make_windows(ids, window_len, num_windows, bos)


def baseline_ppl(model, windows) -> float:
  """Second-half-scored full-precision perplexity, one window at a time."""
  result = evaluate_windows(windows, scored_mask(windows.shape[1],
                                                 "second_half"),
                            window_forward(model), batch_size=1)
  assert result.num_scored_tokens == windows.shape[0] * 255
  return result.baseline.ppl
