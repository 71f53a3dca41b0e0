"""One-off parity check (independent side): transformers on the same GGUF.

Run with an environment holding torch + transformers + gguf (NOT a kvq_jax
dependency), e.g. /tmp/refvenv:

  /tmp/refvenv/bin/python scripts/reference/hf_window_nll.py \
      --gguf=~/.cache/kvq_jax/models/qwen2.5-coder-0.5b.gguf --kvq=/tmp/qwen05.npz

Reads the windows and kvq_jax's per-token NLL/argmax written by
`kvq_window_nll.py`, runs transformers' float32 forward (it dequantizes the
GGUF itself) on the same ids, and prints mean |dNLL| per token, argmax
agreement, and both second-half perplexities.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--gguf", required=True)
  parser.add_argument("--kvq", required=True)
  parser.add_argument("--eval_data", default=None,
                      help="the text the windows came from: also compare "
                      "transformers' tokenizer ids with the windows' ids")
  args = parser.parse_args()
  path = os.path.expanduser(args.gguf)
  torch.set_num_threads(2)
  started = time.perf_counter()
  model = AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path),
      torch_dtype=torch.float32)
  model.eval()
  load_s = time.perf_counter() - started
  ref = np.load(args.kvq)
  ids = ref["ids"]
  if args.eval_data:
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path))
    with open(os.path.expanduser(args.eval_data), encoding="utf-8") as f:
      text = f.read()
    hf_ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"])
    text_part = ids[:, 1:] if int(ref["bos"]) >= 0 else ids
    want = text_part.reshape(-1)
    same = np.array_equal(hf_ids[:want.size], want)
    print(f"tokenizer: transformers {len(hf_ids)} ids for the text; the "
          f"windows' {want.size} text ids {'EQUAL' if same else 'DIFFER'}"
          + ("" if same else f" (first at {np.argmax(hf_ids[:want.size] != want)})"))
  nll, argmax = [], []
  started = time.perf_counter()
  with torch.no_grad():
    for window in ids:
      logits = model(torch.from_numpy(window[None].astype(np.int64))
                     ).logits[0, :-1].double()
      logp = torch.log_softmax(logits, -1)
      nll.append(-logp[torch.arange(len(logits)),
                       torch.from_numpy(window[1:].astype(np.int64))].numpy())
      argmax.append(logits.argmax(-1).numpy())
  run_s = time.perf_counter() - started
  nll, argmax = np.stack(nll), np.stack(argmax)
  half = ids.shape[1] // 2
  diff = np.abs(nll - ref["nll"])
  print(f"transformers load {load_s:.0f} s, {run_s / len(ids):.2f} s/window")
  print(f"windows {ids.shape}: mean |dNLL| all {diff.mean():.2e} nats, "
        f"second half {diff[:, half:].mean():.2e}; max {diff.max():.2e}")
  print(f"argmax agreement {np.mean(argmax == ref['argmax']) * 100:.2f}% "
        f"({argmax.size} positions)")
  print(f"second-half PPL: kvq_jax {np.exp(ref['nll'][:, half:].mean()):.4f}"
        f"  transformers {np.exp(nll[:, half:].mean()):.4f}")


if __name__ == "__main__":
  main()
