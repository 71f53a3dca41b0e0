"""`put_global`: the same host-side value on every process -> one global array.

`jax.device_put(x, sharding)` is all a single process needs. When the
sharding spans several processes (`not sharding.is_fully_addressable`), JAX
wants each process to supply only the shards on its own devices: every
process here holds the whole value (the same checkpoint, the same token
windows), so each cuts its addressable shards out of it
(`jax.make_array_from_callback`). This skips the cross-process equality
check (an all-gather of the whole value) that `device_put` would run, and
works for process-local arrays that `device_put` rejects there. An array
that already spans the processes is resharded by `device_put`.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Sharding


def put_global(x, sharding: Sharding) -> jax.Array:
  """`x` (numpy or a process-local jax.Array; the same value on every
  process) placed with `sharding`."""
  if sharding.is_fully_addressable or (
      isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding,
                                      lambda index: host[index],
                                      dtype=host.dtype)
