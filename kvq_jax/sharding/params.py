"""`shard_params`: tensor-parallel placement of the Decoder's weights.

Rule (Megatron-style, one all-reduce per attention and per MLP block):
  * q / k / v kernels [D, heads*H] (and their biases [heads*H]) are split
    along the output columns over 'model' -- whole heads per device -- when
    the head count (num_heads for q, num_kv_heads for k/v) is divisible by the
    'model' size; otherwise replicated.
  * o kernel [N*H, D]: split along its input rows over 'model' when num_heads
    is divisible.
  * gate / up kernels [D, F]: columns over 'model'; down [F, D]: rows; when
    F (intermediate_size) is divisible, otherwise replicated.
  * everything else -- embedding, lm_head, norm weights (small or used for a
    gather) -- is replicated. Weights are always replicated over 'data'.
The placement changes where the math runs, not the math: sharded outputs
equal unsharded ones up to float reassociation of the split reductions.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kvq_jax.models.config import ModelConfig
from kvq_jax.sharding.mesh import axis_size
from kvq_jax.sharding.placement import put_global


def _names(path) -> list[str]:
  out = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        out.append(str(getattr(key, attr)))
        break
  return [n for n in out if n != "value"]


def param_partition_spec(names: list[str], ndim: int, config: ModelConfig,
                         model_size: int) -> P:
  """The PartitionSpec of one parameter, by its path names (module rule)."""
  heads = {"q": config.num_heads, "k": config.num_kv_heads,
           "v": config.num_kv_heads, "o": config.num_heads}
  if len(names) >= 2 and names[-2] in heads:
    proj, leaf = names[-2], names[-1]
    if heads[proj] % model_size:
      return P()
    if proj == "o":
      return P("model", None) if leaf == "kernel" else P()
    return P(None, "model") if leaf == "kernel" else P("model")
  if len(names) >= 2 and names[-2] in ("gate", "up", "down"):
    if config.intermediate_size % model_size or ndim != 2:
      return P()
    return P("model", None) if names[-2] == "down" else P(None, "model")
  return P()


def param_shardings(state: nnx.State, config: ModelConfig, mesh: Mesh):
  """A pytree of NamedShardings matching `state` (see the module rule)."""
  model_size = axis_size(mesh, "model")
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: NamedSharding(
          mesh, param_partition_spec(_names(path), leaf.ndim, config,
                                     model_size)), state)


def shard_params(decoder_or_state: Any, mesh: Mesh,
                 config: ModelConfig | None = None) -> Any:
  """Places weights on `mesh` by the module rule.

  Args:
    decoder_or_state: a `Decoder` (updated in place and returned; split it,
      or build a `Runtime`, afterwards) or the `nnx.State` of one (a new,
      sharded State is returned).
    mesh: a ('data', 'model') mesh from `make_mesh`.
    config: the ModelConfig; required for a bare State (head counts decide
      divisibility), taken from the Decoder otherwise.
  """
  if isinstance(decoder_or_state, nnx.Module):
    decoder = decoder_or_state
    config = decoder.config
    state = nnx.state(decoder)
    nnx.update(decoder, shard_params(state, mesh, config))
    return decoder
  if config is None:
    raise ValueError(
        "shard_params: config=None with a bare parameter State; allowed: pass "
        "the ModelConfig (head counts decide what divides), or a Decoder.")
  # put_global: on a mesh spanning processes, each cuts its own shards.
  return jax.tree_util.tree_map(
      put_global, decoder_or_state,
      param_shardings(decoder_or_state, config, mesh))
