"""Loads a llama.cpp GGUF checkpoint (llama / qwen2 / gemma3) into kvq_jax.

Every tensor type `gguf.quants.dequantize` knows (F32, F16, BF16, Q4_0, Q4_1,
Q5_*, Q8_0, the K-quants, IQ*) is dequantized to float32 on the CPU. GGUF lists
dims innermost first, so the numpy view of a linear weight is [out, in]; it is
transposed to the Flax [in, out] kernel. llama-architecture attn_q / attn_k
rows (and biases) are un-permuted back to the Hugging Face rotate_half order
(see `rope_permutation.py`); qwen2 files are written unpermuted by
convert_hf_to_gguf (llama.cpp uses NeoX rope for them) and are taken as is.

gemma3 (text) files follow llama.cpp's rules (`llama_model_loader` hparams for
LLM_ARCH_GEMMA3 and `Gemma3Model` in convert_hf_to_gguf): Q/K unpermuted
(NeoX rope, like qwen2); every `*norm.weight` (q/k norms included) already
holds Gemma's 1 + w and is used as is; sliding-window attention of width
`gemma3.attention.sliding_window` on every layer but each 6th (layers 5, 11,
17, ...); RoPE base `rope.freq_base` on global layers and 10000 on local ones
(`rope.freq_base_swa` where a file has it); queries scaled by
1/sqrt(key_length), except 1/sqrt(hidden / heads) for the 62-layer (27B)
model; `final_logit_softcapping` if the file sets it. Transformers' GGUF
loader agrees (it subtracts the 1 again for its own (1 + w) RMSNorm).
"""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np

from kvq_jax.loaders import param_layout
from kvq_jax.loaders import rope_permutation
from kvq_jax.models.config import ModelConfig

# architecture -> (needs Q/K un-permutation, has q/k/v biases).
SUPPORTED_ARCHITECTURES = {"llama": (True, False), "qwen2": (False, True),
                           "gemma3": (False, False)}
# llama.cpp's fixed gemma3 layer pattern: layer i is global iff
# i % period == period - 1 (`hparams.set_swa_pattern(6)`).
GEMMA3_SWA_PERIOD = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_27B_LAYERS = 62


class _TensorTableError(Exception):

  def __init__(self, tensor: str, cause: BaseException):
    super().__init__(tensor)
    self.tensor, self.cause = tensor, cause


class _Reader(gguf.GGUFReader):
  """GGUFReader that reports which tensor could not be mapped (truncation)."""

  def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
    tensors = []
    for field in fields:
      name = bytes(field.parts[1]).decode("utf-8", "replace")
      try:
        super()._build_tensors(start_offs, [field])
      except Exception as e:  # pylint: disable=broad-except
        raise _TensorTableError(name, e) from e
      tensors.extend(self.tensors)
    self.tensors = tensors


def open_gguf(path: str | os.PathLike[str]) -> gguf.GGUFReader:
  """Opens (memory-maps) a GGUF file; ValueError naming it if unreadable."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"GGUF file {path!r} does not exist.")
  try:
    return _Reader(path)
  except _TensorTableError as e:
    raise ValueError(
        f"GGUF file {path!r} is truncated or corrupt at tensor "
        f"{e.tensor!r}: {type(e.cause).__name__}: {e.cause}") from e.cause
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"GGUF file {path!r} is truncated or corrupt (header/metadata): "
        f"{type(e).__name__}: {e}") from e


def metadata_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
  """The decoded value of a metadata key (scalars, strings, lists)."""
  field = reader.fields.get(key)
  if field is None:
    return default
  value = field.contents()
  if field.types == [gguf.GGUFValueType.FLOAT32]:
    # Shortest decimal that round-trips in float32: 1e-05, not 9.99999e-06.
    return float(str(np.float32(value)))
  if isinstance(value, np.generic):
    value = value.item()
  return value


def _required(reader: gguf.GGUFReader, path: str, key: str) -> Any:
  value = metadata_value(reader, key)
  if value is None:
    raise ValueError(f"GGUF file {path!r}: required metadata key {key!r} "
                     "is missing.")
  return value


def config_from_metadata(reader: gguf.GGUFReader, path: str,
                         vocab_size: int, tied: bool) -> ModelConfig:
  """Builds the ModelConfig from `{arch}.*` and `tokenizer.ggml.*` keys."""
  arch = _required(reader, path, "general.architecture")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise ValueError(
        f"GGUF file {path!r}: general.architecture={arch!r} is not supported; "
        f"allowed: {sorted(SUPPORTED_ARCHITECTURES)}.")
  if f"{arch}.rope.scaling.type" in reader.fields and metadata_value(
      reader, f"{arch}.rope.scaling.type") not in ("none", None):
    raise ValueError(
        f"GGUF file {path!r}: {arch}.rope.scaling.type="
        f"{metadata_value(reader, f'{arch}.rope.scaling.type')!r} is not "
        "supported; allowed: 'none'.")
  hidden = int(_required(reader, path, f"{arch}.embedding_length"))
  num_heads = int(_required(reader, path, f"{arch}.attention.head_count"))
  num_kv_heads = int(metadata_value(
      reader, f"{arch}.attention.head_count_kv", num_heads))
  head_dim = int(metadata_value(
      reader, f"{arch}.attention.key_length", hidden // num_heads))
  value_dim = metadata_value(reader, f"{arch}.attention.value_length")
  if value_dim is not None and int(value_dim) != head_dim:
    raise ValueError(
        f"GGUF file {path!r}: {arch}.attention.value_length={value_dim} != "
        f"key_length={head_dim}; allowed: equal head dims.")
  rope_dim = metadata_value(reader, f"{arch}.rope.dimension_count")
  meta_vocab = metadata_value(reader, f"{arch}.vocab_size")
  if meta_vocab is not None and int(meta_vocab) != vocab_size:
    raise ValueError(
        f"GGUF file {path!r}: {arch}.vocab_size={meta_vocab} but tensor "
        f"'token_embd.weight' has {vocab_size} rows.")
  bos = metadata_value(reader, "tokenizer.ggml.bos_token_id")
  eos = metadata_value(reader, "tokenizer.ggml.eos_token_id")
  num_layers = int(_required(reader, path, f"{arch}.block_count"))
  gemma = (_gemma3_fields(reader, path, num_layers, hidden, num_heads,
                          head_dim) if arch == "gemma3" else {})
  return ModelConfig(
      vocab_size=vocab_size,
      hidden_size=hidden,
      intermediate_size=int(_required(
          reader, path, f"{arch}.feed_forward_length")),
      num_layers=num_layers,
      num_heads=num_heads,
      num_kv_heads=num_kv_heads,
      head_dim=head_dim,
      rope_theta=float(metadata_value(reader, f"{arch}.rope.freq_base",
                                      10000.0)),
      rope_dim=None if rope_dim in (None, head_dim) else int(rope_dim),
      rms_norm_eps=float(_required(
          reader, path, f"{arch}.attention.layer_norm_rms_epsilon")),
      tie_embeddings=tied,
      attention_bias=SUPPORTED_ARCHITECTURES[arch][1],
      max_position_embeddings=int(metadata_value(
          reader, f"{arch}.context_length", 8192)),
      bos_token_id=None if bos is None else int(bos),
      eos_token_id=None if eos is None else int(eos),
      name=arch,
      **gemma,
  )


def _gemma3_fields(reader: gguf.GGUFReader, path: str, num_layers: int,
                   hidden: int, num_heads: int,
                   head_dim: int) -> dict[str, Any]:
  """The gemma3-only ModelConfig fields (see the module docstring)."""
  if metadata_value(reader, "gemma3.attn_logit_softcapping") not in (None, 0.0):
    raise ValueError(
        f"GGUF file {path!r}: gemma3.attn_logit_softcapping="
        f"{metadata_value(reader, 'gemma3.attn_logit_softcapping')!r} is not "
        "supported (the KV caches do not soft-cap); allowed: absent or 0.")
  window = metadata_value(reader, "gemma3.attention.sliding_window")
  window = int(window) if window else None
  local = () if window is None else tuple(
      i for i in range(num_layers)
      if i % GEMMA3_SWA_PERIOD != GEMMA3_SWA_PERIOD - 1)
  local_theta = metadata_value(reader, "gemma3.rope.freq_base_swa",
                               GEMMA3_LOCAL_ROPE_THETA)
  scalar = (hidden // num_heads if num_layers == GEMMA3_27B_LAYERS
            else head_dim)
  softcap = metadata_value(reader, "gemma3.final_logit_softcapping")
  return {
      "sliding_window": window,
      "local_layers": local,
      "rope_local_theta": float(local_theta),
      "query_pre_attn_scalar": float(scalar),
      "final_logit_softcapping": float(softcap) if softcap else None,
  }


class _Tensors:
  """Name -> dequantized float32 [out, in] arrays, with file-naming errors."""

  def __init__(self, reader: gguf.GGUFReader, path: str):
    self.path = path
    self.by_name = {}
    for tensor in reader.tensors:
      if tensor.name in self.by_name:
        raise ValueError(f"GGUF file {path!r}: tensor {tensor.name!r} "
                         "appears twice.")
      self.by_name[tensor.name] = tensor
    self.used: set[str] = set()

  def __contains__(self, name: str) -> bool:
    return name in self.by_name

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantized tensor in numpy order ([out, in]) checked against shape."""
    tensor = self.by_name.get(name)
    if tensor is None:
      raise ValueError(f"GGUF file {self.path!r}: tensor {name!r} is missing.")
    self.used.add(name)
    got = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    if got != tuple(shape):
      raise ValueError(
          f"GGUF file {self.path!r}: tensor {name!r} has shape {got} "
          f"(numpy order), expected {tuple(shape)} from the metadata.")
    try:
      array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
      raise ValueError(
          f"GGUF file {self.path!r}: tensor {name!r} has type "
          f"{tensor.tensor_type.name}, which gguf cannot dequantize.") from e
    array = np.asarray(array, dtype=np.float32).reshape(shape)
    if not np.all(np.isfinite(array)):
      raise ValueError(f"GGUF file {self.path!r}: tensor {name!r} holds "
                       "non-finite values (corrupt data).")
    return array


GGUF_NAMES = param_layout.SourceNames(
    layer_prefix="blk.{i}",
    layer={"attn_norm": "attn_norm.weight", "q": "attn_q", "k": "attn_k",
           "v": "attn_v", "o": "attn_output", "mlp_norm": "ffn_norm.weight",
           "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
           # gemma3 only:
           "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
           "post_attn_norm": "post_attention_norm.weight",
           "post_mlp_norm": "post_ffw_norm.weight"},
    embed="token_embd.weight", final_norm="output_norm.weight",
    lm_head="output.weight")


def load_gguf(path: str | os.PathLike[str]) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a GGUF checkpoint; returns (config, float32 numpy params)."""
  return params_from_reader(open_gguf(path), os.fspath(path))


def config_from_reader(reader: gguf.GGUFReader, path: str) -> ModelConfig:
  """The ModelConfig of an opened GGUF (metadata and tensor shapes only: no
  weight is read, so benchmarks get a model's real shapes cheaply)."""
  names = {t.name: t for t in reader.tensors}
  if "token_embd.weight" not in names:
    raise ValueError(f"GGUF file {path!r}: tensor 'token_embd.weight' is "
                     "missing.")
  vocab_size = int(names["token_embd.weight"].shape.tolist()[-1])
  return config_from_metadata(reader, path, vocab_size,
                              tied="output.weight" not in names)


def params_from_reader(reader: gguf.GGUFReader,
                       path: str) -> tuple[ModelConfig, dict[str, Any]]:
  """`load_gguf` on an already opened reader (`path` names it in errors)."""
  tensors = _Tensors(reader, path)
  config = config_from_reader(reader, path)
  if "rope_freqs.weight" in tensors:
    raise ValueError(f"GGUF file {path!r}: tensor 'rope_freqs.weight' (rope "
                     "frequency scaling) is not supported.")
  unpermute = SUPPORTED_ARCHITECTURES[config.name][0]
  heads = {"q": config.num_heads, "k": config.num_kv_heads}

  def fix_rows(key: str, array: np.ndarray) -> np.ndarray:
    if unpermute and key in heads:
      return rope_permutation.unpermute_rows(array, heads[key])
    return array

  params = param_layout.assemble_params(config, tensors.get, GGUF_NAMES,
                                        fix_rows)
  unused = sorted(set(tensors.by_name) - tensors.used)
  if unused:
    raise ValueError(f"GGUF file {path!r}: unexpected tensors {unused[:5]} "
                     f"({len(unused)} in all) for a {config.num_layers}-layer "
                     f"{config.name} model.")
  param_layout.check_params(params, config, f"GGUF file {path!r}")
  return config, params
