"""One-off parity check (independent side): transformers' Gemma 3 logits.

Run with an environment holding torch + transformers + gguf (NOT a kvq_jax
dependency), e.g. /tmp/refvenv:

  /tmp/refvenv/bin/python scripts/reference/gemma3_logits.py \
      --gguf=~/.cache/kvq_jax/models/gemma-3-270m-q4_k_m.gguf \
      --text=../shared/data/wikitext-2-raw/wiki.test.raw \
      --num_tokens=200 --out=/tmp/gemma3_ref.npz

Tokenizes the start of the text with transformers' tokenizer built from the
GGUF (BOS id 2 prepended, as the file's tokenizer.ggml.add_bos_token asks),
runs transformers' float32 forward (it dequantizes the GGUF itself; eager
attention) on 1 + num_tokens ids and saves `ids` [T] and float32 `logits`
[T, V]. Compare with kvq_jax on the same ids, e.g.:

  .venv/bin/python -c "import numpy as np, jax.numpy as jnp; \
      from kvq_jax.loaders.gguf import load_gguf; \
      from kvq_jax.models.params import decoder_from_params; \
      ref = np.load('/tmp/gemma3_ref.npz'); \
      c, p = load_gguf('.../gemma-3-270m-q4_k_m.gguf'); \
      m = decoder_from_params(c, p); ids = jnp.asarray(ref['ids'])[None]; \
      out, _ = m(ids, jnp.arange(ids.shape[1])[None], m.init_cache(1, ids.shape[1]))"
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
  parser.add_argument("--text", required=True)
  parser.add_argument("--num_tokens", type=int, default=200)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  path = os.path.expanduser(args.gguf)
  directory, name = os.path.dirname(path), os.path.basename(path)
  torch.set_num_threads(2)
  started = time.perf_counter()
  tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=name, torch_dtype=torch.float32,
      attn_implementation="eager")
  model.eval()
  print(f"transformers load {time.perf_counter() - started:.0f} s; "
        f"config: {model.config.layer_types}, sliding_window "
        f"{model.config.sliding_window}, rope {model.config.rope_parameters}, "
        f"query_pre_attn_scalar {model.config.query_pre_attn_scalar}, "
        f"final_logit_softcapping {model.config.final_logit_softcapping}")
  with open(os.path.expanduser(args.text), encoding="utf-8") as f:
    text = f.read(200_000)
  body = tokenizer(text, add_special_tokens=False)["input_ids"]
  ids = np.asarray([2] + body[:args.num_tokens], np.int64)
  started = time.perf_counter()
  with torch.no_grad():
    logits = model(torch.from_numpy(ids[None])).logits[0].float().numpy()
  print(f"forward of {len(ids)} tokens: {time.perf_counter() - started:.1f} s;"
        f" first ids {ids[:12].tolist()}")
  np.savez(args.out, ids=ids.astype(np.int32), logits=logits)


if __name__ == "__main__":
  main()
