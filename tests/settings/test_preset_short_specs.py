"""A preset may write cache.k / cache.v as a short spec string
(`settings.experiment_settings.quant_spec_from_config`)."""

from __future__ import annotations

import pytest

from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset

_PRESET = """from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = {k}
  c.cache.v = {v}
  return c
"""


def _spec(tmp_path, name: str, k: str, v: str):
  path = tmp_path / f"{name}.py"
  path.write_text(_PRESET.format(k=k, v=v))
  return settings_from_config(load_preset(str(path))).cache_spec


def test_short_spec_strings_give_the_kv_forms_spec(tmp_path):
  asym = "base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)"
  short = _spec(tmp_path, "short", "'int4_g32_asym'", "'int4_g32_asym'")
  assert short == _spec(tmp_path, "long", asym, asym)
  assert short == settings_from_config(
      load_preset("int4_g32_asym")).cache_spec
  assert (short.k.format, short.k.scheme, short.k.group_size) == (
      "int4", "asymmetric", 32)


def test_k_and_v_strings_differ(tmp_path):
  short = _spec(tmp_path, "short", "'int8_g32'", "'int4_g32'")
  assert short == _spec(tmp_path, "long", "base.kv(type='int', bits=8)",
                        "base.kv(type='int', bits=4)")
  assert short == settings_from_config(load_preset("k8v4")).cache_spec


def test_fp_string_is_full_precision(tmp_path):
  spec = _spec(tmp_path, "fp_v", "'q4_0'", "'fp'")
  assert spec.v is None and spec.k.rounding == "ggml"


def test_a_bad_string_names_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"config\.cache\.k: cache format "
                     r"'int7_g32' is not understood"):
    _spec(tmp_path, "bad", "'int7_g32'", "'int8'")
