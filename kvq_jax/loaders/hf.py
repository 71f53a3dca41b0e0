"""Loads a Hugging Face Llama / SmolLM / Qwen2 checkpoint directory.

Reads config.json and *.safetensors (sharded via model.safetensors.index.json
or not; bf16/f16/f32). torch `Linear.weight` is [out, in]; it is transposed to
the Flax [in, out] kernel. Hugging Face already uses the rotate_half RoPE
convention of `kvq_jax.models.rope`, so Q/K are taken as is.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from kvq_jax.loaders import param_layout
from kvq_jax.loaders import safetensors_io
from kvq_jax.models.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def config_from_hf(hf: dict[str, Any], source: str) -> ModelConfig:
  """Maps a config.json dict onto ModelConfig; ValueError on what we lack."""
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"{source}: model_type={model_type!r} is not supported; "
                     f"allowed: {list(SUPPORTED_MODEL_TYPES)}.")
  if hf.get("rope_scaling") not in (None, {}):
    raise ValueError(f"{source}: rope_scaling={hf['rope_scaling']!r} is not "
                     "supported; allowed: null.")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r}; allowed: "
                     "'silu'.")
  if hf.get("mlp_bias", False):
    raise ValueError(f"{source}: mlp_bias=True is not supported; allowed: "
                     "false.")
  if model_type == "llama" and hf.get("attention_bias", False):
    raise ValueError(f"{source}: attention_bias=True for llama also biases "
                     "o_proj, which the parameter layout lacks; allowed: false.")
  try:
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    head_dim = int(hf.get("head_dim") or hidden // num_heads)
    rope_dim = int(head_dim * float(hf.get("partial_rotary_factor", 1.0)))

    def first(value: Any) -> int | None:
      if isinstance(value, list):
        value = value[0] if value else None
      return None if value is None else int(value)

    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        rope_theta=float(hf.get("rope_theta", 10000.0)),
        rope_dim=None if rope_dim == head_dim else rope_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2",
        max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
        bos_token_id=first(hf.get("bos_token_id")),
        eos_token_id=first(hf.get("eos_token_id")),
        name=model_type,
    )
  except KeyError as e:
    raise ValueError(f"{source}: required key {e.args[0]!r} is missing.") from e


HF_NAMES = param_layout.SourceNames(
    layer_prefix="model.layers.{i}",
    layer={"attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj",
           "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj",
           "mlp_norm": "post_attention_layernorm.weight",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"},
    embed="model.embed_tokens.weight", final_norm="model.norm.weight",
    lm_head="lm_head.weight")


def load_hf(directory: str | os.PathLike[str]) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a Hugging Face checkpoint dir; returns (config, float32 params)."""
  directory = pathlib.Path(directory)
  config_path = directory / "config.json"
  if not config_path.is_file():
    raise ValueError(f"{str(directory)!r} has no config.json; not a Hugging "
                     "Face checkpoint directory.")
  source = repr(str(config_path))
  try:
    hf_config = json.loads(config_path.read_text())
  except ValueError as e:
    raise ValueError(f"{source} is not valid JSON: {e}") from e
  config = config_from_hf(hf_config, source)
  store = safetensors_io.SafetensorsIndex(directory)
  used: set[str] = set()

  def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = store.get(name)
    used.add(name)
    if tuple(array.shape) != shape:
      raise ValueError(f"{str(store.where[name])!r}: tensor {name!r} has shape "
                       f"{tuple(array.shape)}, expected {shape} from "
                       f"{source}.")
    return np.asarray(array, dtype=np.float32)

  params = param_layout.assemble_params(config, get, HF_NAMES)
  if config.tie_embeddings and "lm_head.weight" in store:
    used.add("lm_head.weight")  # Tied: HF ignores the stored copy too.
  unused = sorted(n for n in store.names() - used
                  if not n.endswith(_IGNORED_SUFFIXES))
  if unused:
    raise ValueError(f"{str(directory)!r}: unexpected tensors {unused[:5]} "
                     f"({len(unused)} in all) for {source}.")
  param_layout.check_params(params, config, f"{str(directory)!r}")
  return config, params
