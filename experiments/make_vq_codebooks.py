"""Fits the shipped vector-quantization codebooks (`quant.vector_codebook`).

  python -m experiments.make_vq_codebooks
writes kvq_jax/quant/vq_codebooks.npz (k-means of N(0, I_c), fixed seed)
and logs each table's mean squared error per element on fresh samples
beside the scalar Lloyd-Max product's.
"""

from __future__ import annotations

from absl import flags, logging
import numpy as np

from kvq_jax.cli.entry import run_main
from kvq_jax.quant import vector_codebook

_SAMPLES = flags.DEFINE_integer("num_samples", 1 << 18,
                                "Gaussian draws the k-means is fitted on.")
_ITERS = flags.DEFINE_integer("iters", 300, "Lloyd iterations at most.")
_OUT = flags.DEFINE_string("out", str(vector_codebook.TABLE_PATH),
                           "Where the .npz goes.")


def main(argv):
  del argv
  tables = {}
  for bits in vector_codebook.SUPPORTED_BITS:
    tables[f"bits{bits}"] = vector_codebook.fit_gaussian(
        bits, _SAMPLES.value, _ITERS.value).astype(np.float32)
    held_out = np.random.default_rng(1).standard_normal(
        (1 << 17, vector_codebook.group_dim(bits)))
    c = held_out.shape[1]
    for name, cb in (("k-means", tables[f"bits{bits}"].astype(np.float64)),
                     ("Lloyd-Max product", vector_codebook.product_start(bits))):
      mse = vector_codebook.nearest(held_out, cb)[1].mean() / c
      logging.info("bits %d (c=%d): %s held-out MSE per element %.5f",
                   bits, c, name, mse)
  np.savez(_OUT.value, **tables)
  logging.info("wrote %s", _OUT.value)


if __name__ == "__main__":
  run_main(main)
