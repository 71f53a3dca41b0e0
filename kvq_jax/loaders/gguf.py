"""Loads a llama.cpp GGUF checkpoint (llama / qwen2) into the kvq_jax layout.

Every tensor type `gguf.quants.dequantize` knows (F32, F16, BF16, Q4_0, Q4_1,
Q5_*, Q8_0, the K-quants, IQ*) is dequantized to float32 on the CPU. GGUF lists
dims innermost first, so the numpy view of a linear weight is [out, in]; it is
transposed to the Flax [in, out] kernel. llama-architecture attn_q / attn_k
rows (and biases) are un-permuted back to the Hugging Face rotate_half order
(see `rope_permutation.py`); qwen2 files are written unpermuted by
convert_hf_to_gguf (llama.cpp uses NeoX rope for them) and are taken as is.
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
SUPPORTED_ARCHITECTURES = {"llama": (True, False), "qwen2": (False, True)}


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
  rope_dim = metadata_value(reader, f"{arch}.rope.dimension_count")
  meta_vocab = metadata_value(reader, f"{arch}.vocab_size")
  if meta_vocab is not None and int(meta_vocab) != vocab_size:
    raise ValueError(
        f"GGUF file {path!r}: {arch}.vocab_size={meta_vocab} but tensor "
        f"'token_embd.weight' has {vocab_size} rows.")
  bos = metadata_value(reader, "tokenizer.ggml.bos_token_id")
  eos = metadata_value(reader, "tokenizer.ggml.eos_token_id")
  return ModelConfig(
      vocab_size=vocab_size,
      hidden_size=hidden,
      intermediate_size=int(_required(
          reader, path, f"{arch}.feed_forward_length")),
      num_layers=int(_required(reader, path, f"{arch}.block_count")),
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
  )


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
           "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"},
    embed="token_embd.weight", final_norm="output_norm.weight",
    lm_head="output.weight")


def load_gguf(path: str | os.PathLike[str]) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a GGUF checkpoint; returns (config, float32 numpy params)."""
  return params_from_reader(open_gguf(path), os.fspath(path))


def params_from_reader(reader: gguf.GGUFReader,
                       path: str) -> tuple[ModelConfig, dict[str, Any]]:
  """`load_gguf` on an already opened reader (`path` names it in errors)."""
  tensors = _Tensors(reader, path)
  if "token_embd.weight" not in tensors:
    raise ValueError(f"GGUF file {path!r}: tensor 'token_embd.weight' is "
                     "missing.")
  embd_shape = tensors.by_name["token_embd.weight"].shape.tolist()
  vocab_size = int(embd_shape[-1])
  config = config_from_metadata(reader, path, vocab_size,
                                tied="output.weight" not in tensors)
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
