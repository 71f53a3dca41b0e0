"""Every config field rejects a bad value with a message naming field, value
and what is allowed; bad evaluation text and bad meshes fail clearly.

Loader corruption (truncated / corrupt GGUF, missing tensor, mismatched
shape, HF directory with a missing tensor) is covered in tests/loaders/
(test_gguf.py::test_truncated_file_names_file_and_tensor,
test_missing_tensor_names_file_and_tensor, test_mismatched_shape_names_tensor,
test_hf.py::test_missing_tensor_and_shape_mismatch) and not repeated here.
"""

from __future__ import annotations

import pytest

from kvq_jax.cache.factory import init_cache
from kvq_jax.cli import config_flag
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import make_windows
from kvq_jax.models.config import ModelConfig
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.sharding import make_mesh, parse_mesh_shape


def _config(path: str, value):
  config = config_flag._PresetParser(name="config").parse("int4_g32")  # pylint: disable=protected-access
  node = config
  *parents, last = path.split(".")
  for name in parents:
    node = node[name]
  node[last] = value
  return config


# (field, bad value, regex the ValueError must match): field, value, allowed.
BAD = [
    ("eval.window_len", 0, r"config\.eval\.window_len=0: allowed: an integer >= 2"),
    ("eval.scoring", "x", r"config\.eval\.scoring='x': allowed: all, second_half"),
    ("eval.num_windows", -1, r"config\.eval\.num_windows=-1: allowed: >= 1, or 0"),
    ("eval.batch_size", 0, r"config\.eval\.batch_size=0: allowed: an integer >= 1"),
    ("cache.k.type", "int6", r"config\.cache\.k\.type='int6': allowed: none, int, "
     r"fp8_e4m3, fp8_e5m2"),
    ("cache.k.bits", 6, r"config\.cache\.k\.bits=6: allowed for type='int': 8, 5, "
     r"4, 3, 2"),
    ("cache.v.bits", 6, r"config\.cache\.v\.bits=6"),
    ("cache.k.bits", 1, r"config\.cache\.k: .*int1 allows only: vector"),
    ("cache.k.scheme", "x", r"config\.cache\.k: QuantSpec\.scheme='x' .*allowed: "
     r"symmetric, symmetric_narrow, asymmetric"),
    ("cache.k.granularity", "x", r"config\.cache\.k: QuantSpec\.granularity='x' "
     r".*allowed: per_tensor, per_token, per_channel, per_group"),
    ("cache.k.clip_ratio", 0, r"config\.cache\.k: QuantSpec\.clip_ratio=0\.0 .*"
     r"allowed: a float in \(0, 1\]"),
    ("cache.k.clip_ratio", 1.5, r"QuantSpec\.clip_ratio=1\.5"),
    ("cache.k.scale_dtype", "x", r"config\.cache\.k: QuantSpec\.scale_dtype='x' "
     r".*allowed: float32, bfloat16, float16"),
    ("cache.residual", -1, r"config\.cache: CacheSpec\.residual=-1: allowed: an "
     r"integer >= 0"),
    ("cache.sink", -1, r"CacheSpec\.sink=-1: allowed: an integer >= 0"),
    ("cache.flush_block", -1, r"CacheSpec\.flush_block=-1: must be a positive "
     r"multiple"),
    ("cache.block_size", 0, r"CacheSpec\.block_size=0: allowed: an integer >= 1"),
    ("cache.key_rope", "x", r"config\.cache: CacheSpec\.key_rope='x': allowed: "
     r"post, pre"),
    ("cache.layer_overrides", "bad", r"cache\.layer_overrides item 'bad': "
     r"expected 'LAYER\[,LAYER\.\.\.\]:K_FORMAT/V_FORMAT'"),
    ("cache.layer_overrides", "0:int6/fp", r"cache format 'int6' is not "
     r"understood; allowed: 'fp' or FORMAT"),
    ("cache.dtype", "x", r"config\.cache\.dtype='x': allowed values are float32, "
     r"bfloat16, float16"),
    ("attention.impl", "x", r"attention_impl|config\.attention\.impl='x'"),
    ("memory.budget_gib", -1,
     r"config\.memory\.budget_gib=-1\.0: allowed: a number of GiB > 0, or 0"),
    ("memory.weight_dtype", "x", r"config\.memory\.weight_dtype='x': allowed: "
     r"float32, bfloat16, float16, int8, int4"),
    ("dtype", "x", r"config\.dtype='x': allowed values are float32, bfloat16, "
     r"float16"),
    ("decode_bench.batch_size", 0, r"config\.decode_bench\.batch_size=0: "
     r"allowed: an integer >= 1"),
    ("decode_bench.context", 0, r"config\.decode_bench\.context=0: allowed"),
    ("decode_bench.steps", 0, r"config\.decode_bench\.steps=0: allowed"),
]


@pytest.mark.parametrize("field, value, match", BAD,
                         ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_bad_config_value_names_field_value_and_allowed(field, value, match):
  with pytest.raises(ValueError, match=match):
    settings_from_config(_config(field, value))


def test_attention_impl_message_names_the_config_field():
  with pytest.raises(ValueError) as info:
    settings_from_config(_config("attention.impl", "x"))
  assert "'x'" in str(info.value) and "xla" in str(info.value)


def test_group_size_not_dividing_head_dim_fails_when_the_cache_is_built():
  """settings do not know head_dim: group_size=7 passes them and fails at
  init_cache (the first forward in the runner) naming group_size, 64 and the
  allowed divisors."""
  settings = settings_from_config(_config("cache.k.group_size", 7))
  config = ModelConfig(vocab_size=8, hidden_size=64, intermediate_size=8,
                       num_layers=1, num_heads=1, num_kv_heads=1, head_dim=64)
  with pytest.raises(ValueError, match=r"QuantSpec\.group_size=7 does not "
                     r"divide the length 64 of axis -1.*allowed: a divisor of "
                     r"64"):
    init_cache(config, 1, 16, settings.cache_spec)


def test_window_len_one_rejected_by_settings():
  with pytest.raises(ValueError, match=r"eval\.window_len=1: allowed: an integer >= 2"):
    settings_from_config(_config("eval.window_len", 1))


def test_window_len_one_rejected_by_make_windows():
  with pytest.raises(ValueError, match=r"eval\.window_len=1: must be >= 2"):
    make_windows(list(range(10)), 1, 0)


@pytest.mark.parametrize("ids", [[], [3], list(range(31))])
def test_too_short_or_empty_token_stream(ids):
  with pytest.raises(ValueError, match=rf"evaluation text has {len(ids)} "
                     r"tokens, fewer than one window of eval\.window_len=32"):
    make_windows(ids, 32, 2)


def test_empty_and_missing_eval_files(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  with pytest.raises(ValueError, match=r"eval_data='.*empty\.txt': the file "
                     r"is empty"):
    load_eval_text(empty)
  with pytest.raises(ValueError, match=r"eval_data='.*nope\.txt': no such "
                     r"file"):
    load_eval_text(tmp_path / "nope.txt")


@pytest.mark.parametrize("text", ["", "2", "2x", "x4", "2x0", "0x2", "2*4",
                                  "-1x2", "2x4x1", None])
def test_bad_mesh_text(text):
  with pytest.raises(ValueError, match=r"mesh=.*(allowed|must be >= 1)"):
    parse_mesh_shape(text)


def test_mesh_larger_than_device_count():
  import jax
  n = jax.device_count()
  with pytest.raises(ValueError, match=rf"mesh=1x{n + 1} needs {n + 1} "
                     rf"devices; only {n} available.*allowed: DATA \* MODEL "
                     rf"<= {n}.*xla_force_host_platform_device_count"):
    make_mesh(f"1x{n + 1}")
  with pytest.raises(ValueError, match=r"two positive integers"):
    make_mesh((2, 0))
  mesh = make_mesh("1x1")
  assert mesh.axis_names == ("data", "model") and mesh.devices.shape == (1, 1)
