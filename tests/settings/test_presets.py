"""Preset names and paths -> config files (`settings.presets`)."""

from __future__ import annotations

import pathlib

import pytest

from kvq_jax.settings import presets
from kvq_jax.settings.presets import CONFIG_DIR, resolve_config_path


def test_resolve_preset_name_and_paths(tmp_path):
  path = resolve_config_path("int4_g32")
  assert pathlib.Path(path) == CONFIG_DIR / "formats" / "int4_g32.py"
  assert resolve_config_path("int4_g32:extra") == path + ":extra"
  # A folder-qualified name resolves to the same file.
  assert resolve_config_path("formats/int4_g32") == path
  assert resolve_config_path("alloc/smollm2-135m/cvmix250") == \
      resolve_config_path("cvmix250")
  # A command written before configs/ had roles still finds its preset.
  assert resolve_config_path("configs/int4_g32.py") == path
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


def test_an_allocation_preset_is_refused_on_another_model(tmp_path):
  # Inside a run of another model (the run context every script opens),
  # an allocation preset fails in one line naming the model it was made
  # for; on its own model, and with no run open, it resolves.
  from kvq_jax.calibration import auto_key_stats
  from kvq_jax.settings.experiment_settings import settings_from_config
  for name, made_for in (("cvmix250", "smollm2-135m"),
                         ("qwen_cvmix250", "qwen2.5-coder-0.5b"),
                         ("gemma_cvmix250", "gemma3-270m"),
                         ("tqmix425", "smollm2-135m")):
    config = presets.load_preset(name)
    assert config.made_for == made_for
    with auto_key_stats.run_context("llama-like-other", None):
      with pytest.raises(ValueError) as e:
        settings_from_config(config)
    message = str(e.value)
    assert f"allocated for {made_for}" in message and "\n" not in message
    assert "llama-like-other" in message
  assert presets.load_preset("int4_g32").made_for == ""
  with auto_key_stats.run_context("llama-like-other", None):
    settings_from_config(presets.load_preset("int4_g32"))


def test_every_preset_sits_in_a_role_folder_under_a_unique_name():
  names = presets.available_presets()
  assert len(names) == len(set(names)) >= 50
  for name in names:
    assert presets.preset_role(name) in presets.ROLES, name
  # An allocation's folder names the model it was made for.
  for name in names:
    path = presets.preset_paths()[name].relative_to(CONFIG_DIR)
    if path.parts[0] == "alloc":
      assert presets.load_preset(name).made_for == path.parts[1], name
    elif path.parts[0] in ("formats", "methods"):
      assert presets.load_preset(name).made_for == "", name
