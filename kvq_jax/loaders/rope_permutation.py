"""llama.cpp's Q/K row permutation for interleaved RoPE, and its inverse.

Hugging Face Llama rotates the pair (x[i], x[i + H/2]) ("rotate_half");
llama.cpp rotates adjacent pairs (x[2i], x[2i + 1]). `convert_hf_to_gguf.py`
(`LlamaModel.permute`) therefore reorders the output rows of q_proj / k_proj
(and their biases) inside every head:

  w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)

with n_head = num_heads for Q and num_kv_heads for K. `unpermute_rows` is the
exact inverse (the same as `reverse_permute_weights` in transformers'
`integrations/ggml.py`). Arrays are indexed [out, ...] (the numpy view of a
GGUF tensor, before transposing to the Flax [in, out] layout).
"""

from __future__ import annotations

import numpy as np


def _check(w: np.ndarray, n_head: int) -> None:
  if n_head <= 0 or w.shape[0] % (2 * n_head):
    raise ValueError(
        f"n_head={n_head}: rows={w.shape[0]} must be a positive multiple of "
        "2 * n_head for the llama.cpp rope permutation.")


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """HF -> llama.cpp: what convert_hf_to_gguf applies to attn_q / attn_k."""
  _check(w, n_head)
  half = w.shape[0] // n_head // 2
  return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp -> HF: the exact inverse of `permute_rows`."""
  _check(w, n_head)
  half = w.shape[0] // n_head // 2
  return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
