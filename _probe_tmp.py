import time, jax, jax.numpy as jnp, numpy as np
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import QuantSpec
from tests.models.tiny import TINY
m = decoder_from_params(TINY, random_params(TINY, seed=5, scale=0.1))
rt = Runtime(m)
ids = jnp.asarray(np.random.default_rng(0).integers(0, 97, (2, 40)), jnp.int32)
for spec in [CacheSpec(k=QuantSpec("int4","symmetric","per_group",8), v=QuantSpec("int4","symmetric","per_group",8), block_size=16),
  CacheSpec(k=QuantSpec("int2","asymmetric","per_channel",8), v=QuantSpec("int2","asymmetric","per_group",8), residual=8, block_size=16),
  CacheSpec(k=QuantSpec("int8","asymmetric","per_token"), v=QuantSpec("int2","asymmetric","per_group",8), residual=8, block_size=16)]:
  for T in (40, 1, 7):
    t=time.time()
    c = init_cache(TINY, 2, 48, spec)
    lp, _ = rt.prefill(ids[:, :T], c); lp.block_until_ready(); print(T, time.time()-t)
