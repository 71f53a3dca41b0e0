"""Loads a Hugging Face Llama / SmolLM / Qwen2 / Gemma 3 text checkpoint dir.

Reads config.json and *.safetensors (sharded via model.safetensors.index.json
or not; bf16/f16/f32). torch `Linear.weight` is [out, in]; it is transposed to
the Flax [in, out] kernel. Hugging Face already uses the rotate_half RoPE
convention of `kvq_jax.models.rope`, so Q/K are taken as is.

Gemma 3 (`model_type: gemma3_text`, i.e. Gemma3ForCausalLM; the multimodal
`gemma3` wrapper is refused): Gemma3RMSNorm computes x_hat * (1 + w), and the
parameter layout stores 1 + w (llama.cpp's GGUF convention), so 1 is added to
every norm weight; the layer pattern comes from `layer_types` (or
`sliding_window_pattern`, default 6), the RoPE bases from `rope_parameters`
(or `rope_theta` / `rope_local_base_freq`), HF's defaults filling the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np

from kvq_jax.loaders import param_layout
from kvq_jax.loaders import safetensors_io
from kvq_jax.models.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "gemma3_text")
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
# Gemma3TextConfig defaults (transformers' configuration_gemma3.py).
_GEMMA3_DEFAULTS = {
    "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0, "sliding_window": 4096,
    "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
    "max_position_embeddings": 131_072, "tie_word_embeddings": True,
    "bos_token_id": 2, "eos_token_id": 1, "vocab_size": 262_208,
    "num_key_value_heads": 4,
}


def _gemma3_fields(hf: dict[str, Any], source: str,
                   num_layers: int) -> dict[str, Any]:
  """gemma3_text -> the Gemma ModelConfig fields; ValueError on what we lack."""
  act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
  if act != "gelu_pytorch_tanh":
    raise ValueError(f"{source}: hidden_activation={act!r}; allowed: "
                     "'gelu_pytorch_tanh'.")
  for key in ("attn_logit_softcapping", "use_bidirectional_attention",
              "attention_bias"):
    if hf.get(key):
      raise ValueError(f"{source}: {key}={hf[key]!r} is not supported; "
                       "allowed: null/false.")
  rope = hf.get("rope_parameters") or {}
  for kind, params in rope.items():
    if (params or {}).get("rope_type", "default") != "default":
      raise ValueError(f"{source}: rope_parameters[{kind!r}]={params!r} is "
                       "not supported; allowed: rope_type 'default'.")
  global_theta = (rope.get("full_attention") or {}).get(
      "rope_theta", hf.get("rope_theta", _GEMMA3_DEFAULTS["rope_theta"]))
  local_theta = (rope.get("sliding_attention") or {}).get(
      "rope_theta", hf.get("rope_local_base_freq",
                           _GEMMA3_DEFAULTS["rope_local_base_freq"]))
  layer_types = hf.get("layer_types")
  if layer_types is None:
    period = int(hf.get("sliding_window_pattern",
                        _GEMMA3_DEFAULTS["sliding_window_pattern"]))
    layer_types = ["sliding_attention" if (i + 1) % period else
                   "full_attention" for i in range(num_layers)]
  if (len(layer_types) != num_layers or not set(layer_types) <= {
      "sliding_attention", "full_attention"}):
    raise ValueError(f"{source}: layer_types={layer_types!r}; allowed: "
                     f"{num_layers} entries of 'sliding_attention' / "
                     "'full_attention'.")
  window = hf.get("sliding_window")
  local = tuple(i for i, kind in enumerate(layer_types)
                if kind == "sliding_attention")
  if local and not window:
    raise ValueError(f"{source}: sliding_window={window!r} with sliding "
                     "layers; allowed: a positive integer.")
  softcap = hf.get("final_logit_softcapping")
  return {
      "rope_theta": float(global_theta),
      "rope_local_theta": float(local_theta),
      "sliding_window": int(window) if local else None,
      "local_layers": local,
      "query_pre_attn_scalar": float(hf.get(
          "query_pre_attn_scalar",
          _GEMMA3_DEFAULTS["query_pre_attn_scalar"])),
      "final_logit_softcapping": None if softcap is None else float(softcap),
  }


def config_from_hf(hf: dict[str, Any], source: str) -> ModelConfig:
  """Maps a config.json dict onto ModelConfig; ValueError on what we lack."""
  model_type = hf.get("model_type")
  if model_type == "gemma3":
    raise ValueError(f"{source}: model_type='gemma3' is the multimodal "
                     "Gemma3ForConditionalGeneration, not supported; allowed: "
                     "a text-only checkpoint (model_type 'gemma3_text').")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"{source}: model_type={model_type!r} is not supported; "
                     f"allowed: {list(SUPPORTED_MODEL_TYPES)}.")
  gemma = model_type == "gemma3_text"
  if gemma:
    hf = _GEMMA3_DEFAULTS | hf
  if hf.get("rope_scaling") not in (None, {}):
    raise ValueError(f"{source}: rope_scaling={hf['rope_scaling']!r} is not "
                     "supported; allowed: null.")
  if not gemma and hf.get("hidden_act", "silu") != "silu":
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

    num_layers = int(hf["num_hidden_layers"])
    fields = dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=num_layers,
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
        name="gemma3" if gemma else model_type,
    )
    if gemma:
      fields |= _gemma3_fields(hf, source, num_layers)
    return ModelConfig(**fields)
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
# Gemma 3 names its four block norms by position: `post_attention_layernorm`
# is the norm *after* attention there, not llama's pre-MLP norm.
GEMMA3_HF_NAMES = dataclasses.replace(HF_NAMES, layer={
    **HF_NAMES.layer,
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "post_attn_norm": "post_attention_layernorm.weight",
    "mlp_norm": "pre_feedforward_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight"})


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
    array = np.asarray(array, dtype=np.float32)
    if config.name == "gemma3" and name.endswith("norm.weight"):
      array = array + np.float32(1.0)  # Gemma3RMSNorm's (1 + w).
    return array

  names = GEMMA3_HF_NAMES if config.name == "gemma3" else HF_NAMES
  params = param_layout.assemble_params(config, get, names)
  if config.tie_embeddings and "lm_head.weight" in store:
    used.add("lm_head.weight")  # Tied: HF ignores the stored copy too.
  unused = sorted(n for n in store.names() - used
                  if not n.endswith(_IGNORED_SUFFIXES))
  if unused:
    raise ValueError(f"{str(directory)!r}: unexpected tensors {unused[:5]} "
                     f"({len(unused)} in all) for {source}.")
  param_layout.check_params(params, config, f"{str(directory)!r}")
  return config, params
