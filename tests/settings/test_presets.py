"""Preset names and paths -> config files (`settings.presets`)."""

from __future__ import annotations

import pathlib

import pytest

from kvq_jax.settings.presets import CONFIG_DIR, resolve_config_path


def test_resolve_preset_name_and_paths(tmp_path):
  path = resolve_config_path("int4_g32")
  assert pathlib.Path(path) == CONFIG_DIR / "int4_g32.py"
  assert resolve_config_path("int4_g32:extra") == path + ":extra"
  own = tmp_path / "mine.py"
  own.write_text("def get_config():\n  return None\n")
  assert resolve_config_path(str(own)) == str(own)
  assert resolve_config_path(f"{own}:arg") == f"{own}:arg"


def test_unknown_preset_lists_presets():
  with pytest.raises(ValueError) as info:
    resolve_config_path("nonexistent")
  message = str(info.value)
  assert "no preset named 'nonexistent'" in message
  for name in ("baseline", "int4_g32", "kivi2"):
    assert name in message


def test_missing_path_rejected(tmp_path):
  with pytest.raises(ValueError, match="no such config file"):
    resolve_config_path(str(tmp_path / "absent.py"))
