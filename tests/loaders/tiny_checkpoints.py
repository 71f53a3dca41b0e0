"""Writers of tiny synthetic checkpoints (GGUF and Hugging Face) for tests."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import gguf
import ml_dtypes
import numpy as np
import safetensors.numpy

from kvq_jax.loaders import rope_permutation

# Dims chosen so every quantized row length is a multiple of 32 (Q8_0/Q4_0).
V, D, F, N, K, H, L = 64, 32, 64, 4, 2, 8, 2

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'"
    " + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")


def byte_level_alphabet() -> list[str]:
  """GPT-2's bytes_to_unicode characters, in byte order 0..255."""
  printable = (list(range(ord("!"), ord("~") + 1)) +
               list(range(ord("¡"), ord("¬") + 1)) +
               list(range(ord("®"), ord("ÿ") + 1)))
  mapping, extra = {}, 0
  for b in range(256):
    if b in printable:
      mapping[b] = chr(b)
    else:
      mapping[b] = chr(256 + extra)
      extra += 1
  return [mapping[b] for b in range(256)]


MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d",
          "Ġwor ld", "1 2"]


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
  """(tokens, merges, token_types): specials, 256 bytes, one token per merge."""
  tokens = SPECIALS + byte_level_alphabet()
  tokens += [m.replace(" ", "") for m in MERGES]
  types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
  return tokens, list(MERGES), types


def random_hf_weights(seed: int = 0, bias: bool = False,
                      tied: bool = True) -> dict[str, np.ndarray]:
  """Hugging Face-named float32 weights ([out, in]) for the tiny shapes."""
  rng = np.random.default_rng(seed)
  r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
  w = {"model.embed_tokens.weight": r(V, D), "model.norm.weight": r(D)}
  if not tied:
    w["lm_head.weight"] = r(V, D)
  for i in range(L):
    p = f"model.layers.{i}"
    w[f"{p}.input_layernorm.weight"] = r(D)
    w[f"{p}.post_attention_layernorm.weight"] = r(D)
    w[f"{p}.self_attn.q_proj.weight"] = r(N * H, D)
    w[f"{p}.self_attn.k_proj.weight"] = r(K * H, D)
    w[f"{p}.self_attn.v_proj.weight"] = r(K * H, D)
    w[f"{p}.self_attn.o_proj.weight"] = r(D, N * H)
    w[f"{p}.mlp.gate_proj.weight"] = r(F, D)
    w[f"{p}.mlp.up_proj.weight"] = r(F, D)
    w[f"{p}.mlp.down_proj.weight"] = r(D, F)
    if bias:
      for proj, n in (("q", N), ("k", K), ("v", K)):
        w[f"{p}.self_attn.{proj}_proj.bias"] = r(n * H)
  return w


# HF name piece -> GGUF name piece.
_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

# GGUF tensor -> storage type in the tiny file (others F32).
QUANTIZED = {
    "blk.0.ffn_up.weight": gguf.GGMLQuantizationType.Q8_0,
    "blk.1.attn_output.weight": gguf.GGMLQuantizationType.Q4_0,
    "token_embd.weight": gguf.GGMLQuantizationType.Q8_0,
    "blk.1.attn_v.weight": gguf.GGMLQuantizationType.F16,
}


def gguf_name(hf_name: str) -> str:
  if hf_name == "model.embed_tokens.weight":
    return "token_embd.weight"
  if hf_name == "model.norm.weight":
    return "output_norm.weight"
  if hf_name == "lm_head.weight":
    return "output.weight"
  _, _, i, rest = hf_name.split(".", 3)
  for hf_piece, gguf_piece in _GGUF_NAMES.items():
    if rest.startswith(hf_piece):
      return f"blk.{i}.{gguf_piece}{rest[len(hf_piece):]}"
  raise KeyError(hf_name)


def stored_value(gguf_tensor: str, w: np.ndarray) -> np.ndarray:
  """What a loader should read back for w (quantization round trip)."""
  qtype = QUANTIZED.get(gguf_tensor)
  if qtype is None:
    return w
  return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)


def write_gguf(path: pathlib.Path, weights: dict[str, np.ndarray], *,
               arch: str = "llama", drop: tuple[str, ...] = (),
               reshape: dict[str, tuple[int, ...]] | None = None,
               with_tokenizer: bool = True, pre: str = "smollm") -> None:
  """Writes weights (HF names/layout) as llama.cpp would store them."""
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_block_count(L)
  writer.add_context_length(128)
  writer.add_embedding_length(D)
  writer.add_feed_forward_length(F)
  writer.add_head_count(N)
  writer.add_head_count_kv(K)
  writer.add_rope_freq_base(50000.0)
  writer.add_rope_dimension_count(H)
  writer.add_layer_norm_rms_eps(1e-5)
  writer.add_vocab_size(V)
  if with_tokenizer:
    tokens, merges, types = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
  for hf_name, w in weights.items():
    name = gguf_name(hf_name)
    if name in drop:
      continue
    if arch == "llama" and ".attn_q." in name:
      w = rope_permutation.permute_rows(w, N)
    elif arch == "llama" and ".attn_k." in name:
      w = rope_permutation.permute_rows(w, K)
    if reshape and name in reshape:
      w = np.resize(w, reshape[name])
    qtype = QUANTIZED.get(name)
    if qtype is None:
      writer.add_tensor(name, w)
    elif qtype == gguf.GGMLQuantizationType.F16:
      writer.add_tensor(name, w.astype(np.float16))
    else:
      writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def write_hf(directory: pathlib.Path, weights: dict[str, np.ndarray], *,
             model_type: str = "llama", tied: bool = True,
             dtype: Any = np.float32, shards: int = 1,
             extra_config: dict[str, Any] | None = None) -> None:
  """Writes config.json + (optionally sharded) safetensors."""
  directory.mkdir(parents=True, exist_ok=True)
  config = {
      "model_type": model_type, "vocab_size": V, "hidden_size": D,
      "intermediate_size": F, "num_hidden_layers": L,
      "num_attention_heads": N, "num_key_value_heads": K,
      "rope_theta": 50000.0, "rms_norm_eps": 1e-5,
      "tie_word_embeddings": tied, "max_position_embeddings": 128,
      "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  } | (extra_config or {})
  (directory / "config.json").write_text(json.dumps(config))
  names = sorted(weights)
  cast = {n: weights[n].astype(dtype) for n in names}
  if shards == 1:
    safetensors.numpy.save_file(cast, str(directory / "model.safetensors"))
    return
  weight_map = {}
  for s in range(shards):
    file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = {n: cast[n] for n in names[s::shards]}
    safetensors.numpy.save_file(part, str(directory / file))
    weight_map |= {n: file for n in part}
  (directory / "model.safetensors.index.json").write_text(
      json.dumps({"metadata": {}, "weight_map": weight_map}))


BF16 = ml_dtypes.bfloat16
