"""Functional quantization ops: spec, packing, quantize, accounting."""

from kvq_jax.quant.accounting import bits_per_element
from kvq_jax.quant.accounting import cache_bits_per_element
from kvq_jax.quant.accounting import constant_arrays, has_fixed_table, table_id
from kvq_jax.quant.accounting import nbytes
from kvq_jax.quant.ggml import GGML_TYPES
from kvq_jax.quant.ggml import ggml_name
from kvq_jax.quant.ggml import ggml_spec
from kvq_jax.quant.packing import pack
from kvq_jax.quant.packing import unpack
from kvq_jax.quant.quantize import dequantize
from kvq_jax.quant.quantize import quantize
from kvq_jax.quant.quantized_array import QuantizedArray
from kvq_jax.quant.spec import FORMATS
from kvq_jax.quant.spec import GRANULARITIES
from kvq_jax.quant.spec import QuantSpec
from kvq_jax.quant.spec import ROUNDINGS
from kvq_jax.quant.spec import SCALE_DTYPES
from kvq_jax.quant.spec import SCHEMES

__all__ = [
    "FORMATS", "GGML_TYPES", "GRANULARITIES", "QuantSpec", "QuantizedArray",
    "ROUNDINGS", "SCALE_DTYPES", "SCHEMES", "bits_per_element",
    "cache_bits_per_element", "constant_arrays", "has_fixed_table", "table_id", "dequantize",
    "ggml_name", "ggml_spec", "nbytes", "pack", "quantize", "unpack",
]
