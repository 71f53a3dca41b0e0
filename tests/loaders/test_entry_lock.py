"""entry_lock.hold: one holder per entry, a timeout naming the lock."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re

import pytest

from kvq_jax.assets import entry_lock


def test_second_holder_times_out_naming_the_lock_and_its_holder(tmp_path,
                                                                capsys):
  entry = tmp_path / "params" / "m-0123"
  lock = tmp_path / "params" / "m-0123.lock"
  with entry_lock.hold(entry, "converting /src/a.gguf"):
    assert f"pid {os.getpid()}" in lock.read_text()
    # A second open file description conflicts, as another process would.
    with pytest.raises(entry_lock.LockTimeoutError,
                       match=(rf"Waited 0.2 s for lock {re.escape(str(lock))} "
                              rf"\(held by pid {os.getpid()} .*, converting "
                              r"/src/a.gguf\) before converting b")):
      with entry_lock.hold(entry, "converting b", timeout_s=0.2):
        pass
  waited = capsys.readouterr().err
  assert f"waiting for lock {lock} (held by pid {os.getpid()}" in waited
  assert "before converting b" in waited
  assert not lock.exists()  # Removed on release.
  with entry_lock.hold(entry, "converting c", timeout_s=0.2):
    assert "converting c" in lock.read_text()  # Free again.
  assert sorted(p.name for p in (tmp_path / "params").iterdir()) == []


def test_a_lock_file_removed_before_flock_is_not_trusted(tmp_path,
                                                         monkeypatch):
  """The previous holder removes the file between our open and our flock: we
  must lock the path's new file, not the removed one nobody else can see."""
  path = tmp_path / "x.lock"
  real_flock = fcntl.flock
  calls = []

  def flock(fd, op):
    calls.append(op)
    if len(calls) == 1:
      os.unlink(path)  # The old holder releases: unlink, then unlock.
    return real_flock(fd, op)

  monkeypatch.setattr(entry_lock.fcntl, "flock", flock)
  fd = entry_lock._try_lock(path)  # pylint: disable=protected-access
  try:
    assert len(calls) == 2
    assert os.fstat(fd).st_ino == os.stat(path).st_ino
  finally:
    os.close(fd)


def test_file_system_without_flock_goes_on_unlocked(tmp_path, monkeypatch,
                                                    caplog):
  def no_flock(fd, op):
    del fd, op
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

  monkeypatch.setattr(entry_lock.fcntl, "flock", no_flock)
  entry = tmp_path / "models" / "m.gguf"
  ran = []
  with caplog.at_level(logging.WARNING):
    with entry_lock.hold(entry, "fetching m.gguf", timeout_s=0.2):
      ran.append(True)
  assert ran == [True]
  assert not list(entry.parent.iterdir())  # No lock file left behind.
  assert any("Cannot lock" in r.getMessage() and str(entry) in r.getMessage()
             for r in caplog.records)
