"""One-off parity helper (kvq_jax side): per-token NLL of evaluation windows.

Writes `ids` [W, T], `nll` [W, T-1] (float64, natural log) and `argmax`
[W, T-1] of the kvq_jax full-precision forward for the first W windows of a
text, tokenized and windowed exactly as `experiments.run` does (BOS per
window where the model expects one). `hf_window_nll.py` (run in an
environment with transformers) reads the file and compares.

  .venv/bin/python scripts/reference/kvq_window_nll.py --model=qwen2.5-coder-0.5b \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw --num_windows=4 \
      --out=/tmp/qwen05.npz
"""

from __future__ import annotations

import time

import numpy as np
from absl import app, flags

from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import make_windows, text_ids
from kvq_jax.facade import load_model, window_forward

_MODEL = flags.DEFINE_string("model", "smollm2-135m", "model name or path")
_DATA = flags.DEFINE_string("eval_data", None, "text file (default corpus if unset)")
_NUM = flags.DEFINE_integer("num_windows", 4, "windows")
_LEN = flags.DEFINE_integer("window_len", 512, "tokens per window")
_DTYPE = flags.DEFINE_string("dtype", "float32", "compute dtype")
_OUT = flags.DEFINE_string("out", None, "output .npz", required=True)


def main(argv):
  del argv
  lm = load_model(_MODEL.value, _DTYPE.value)
  text, _ = load_eval_text(_DATA.value)
  ids, bos = text_ids(lm.tokenizer, text)
  windows = make_windows(ids, _LEN.value, _NUM.value, bos)
  forward = window_forward(lm)
  started = time.perf_counter()
  nll, argmax = [], []
  for window in windows:  # One at a time: bounded memory for big vocabularies.
    logits = np.asarray(forward(window[None]), np.float64)[0, :-1]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) \
        + logits.max(-1)
    nll.append(logz - logits[np.arange(len(logits)), window[1:]])
    argmax.append(logits.argmax(-1))
  seconds = time.perf_counter() - started
  np.savez(_OUT.value, ids=windows, nll=np.stack(nll),
           argmax=np.stack(argmax), bos=-1 if bos is None else bos)
  half = _LEN.value // 2
  print(f"{_MODEL.value}: {len(windows)} windows x {_LEN.value}, "
        f"{seconds / len(windows):.2f} s/window, second-half PPL "
        f"{np.exp(np.stack(nll)[:, half:].mean()):.4f}")


if __name__ == "__main__":
  app.run(main)
