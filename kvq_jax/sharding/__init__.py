"""Multi-device placement: a ('data', 'model') mesh, sharded weights, caches.

  mesh = make_mesh("2x4")
  decoder = shard_params(decoder, mesh)        # heads / MLP over 'model'
  cache = shard_cache(init_cache(...), mesh)   # batch 'data', KV heads 'model'

Runtime / jit then run SPMD over the mesh (GSPMD propagates the shardings;
tensor-parallel sums make those results equal the unsharded ones up to float
reassociation). Evaluation (`sharded_window_forward`) instead runs every
window whole on one device, so its logits and caches are bit-identical to
the unsharded run's (see `sharding/eval.py`).
"""

from kvq_jax.sharding.cache import batch_sharding
from kvq_jax.sharding.cache import layer_partition_specs
from kvq_jax.sharding.cache import shard_cache
from kvq_jax.sharding.eval import sharded_window_forward
from kvq_jax.sharding.eval import sharded_window_prefill
from kvq_jax.sharding.mesh import AXES
from kvq_jax.sharding.mesh import make_mesh
from kvq_jax.sharding.mesh import parse_mesh_shape
from kvq_jax.sharding.params import param_partition_spec
from kvq_jax.sharding.params import param_shardings
from kvq_jax.sharding.params import shard_params

__all__ = [
    "AXES", "batch_sharding", "layer_partition_specs", "make_mesh",
    "param_partition_spec", "param_shardings", "parse_mesh_shape",
    "shard_cache", "shard_params", "sharded_window_forward",
    "sharded_window_prefill",
]
