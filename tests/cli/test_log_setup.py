"""log_setup: other libraries' INFO off by default, back on request."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

from absl import logging as absl_logging
import pytest

from kvq_jax.cli import log_setup

# Stand-ins for orbax's and jax's modules (importing orbax takes seconds).
OTHER_FILE = absl_logging.__file__
OWN_FILE = log_setup.__file__


def _record(level: int, pathname: str, msg: str) -> logging.LogRecord:
  # absl.logging (orbax's and kvq_jax's) logs to the one logger "absl".
  return logging.LogRecord("absl", level, pathname, 1, msg, None, None)


def _emitted(handler: logging.Handler, stream: io.StringIO,
             *records: logging.LogRecord) -> list[str]:
  stream.seek(0)
  stream.truncate()
  for record in records:
    handler.handle(record)
  return stream.getvalue().splitlines()


def test_other_libraries_info_is_dropped_own_info_and_warnings_kept():
  stream = io.StringIO()
  handler = logging.StreamHandler(stream)
  records = (_record(logging.INFO, OTHER_FILE, "lib info"),
             _record(logging.WARNING, OTHER_FILE, "lib warning"),
             _record(logging.INFO, OWN_FILE, "own info"),
             _record(logging.DEBUG, OTHER_FILE, "lib debug"))
  log_setup.configure("warning", handler=handler)
  assert _emitted(handler, stream, *records) == ["lib warning", "own info"]
  log_setup.configure("error", handler=handler)
  assert _emitted(handler, stream, *records) == ["own info"]
  # A later call replaces the filter: INFO (then DEBUG) comes back.
  log_setup.configure("info", handler=handler)
  assert _emitted(handler, stream, *records) == [
      "lib info", "lib warning", "own info"]
  log_setup.configure("debug", handler=handler)
  assert len(_emitted(handler, stream, *records)) == 4
  assert len(handler.filters) == 1


def test_unknown_level_names_the_allowed_ones():
  with pytest.raises(ValueError, match=r"log_level='loud'.*debug, info, "
                     r"warning, error"):
    log_setup.configure("loud", handler=logging.NullHandler())


# An absl app as the experiment scripts are: this file lies outside kvq_jax,
# so its own absl.logging and the "jax" logger are other libraries.
_APP = """
import logging, os, warnings
from absl import app
from absl import logging as absl_logging
from kvq_jax.cli import log_setup

def main(argv):
  log_setup.configure_from_flags()
  absl_logging.info("lib info")
  logging.getLogger("jax._src.xla_bridge").info("jax info")
  absl_logging.warning("lib warning")
  absl_logging.debug("lib debug")
  logging.getLogger("absl").handle(logging.LogRecord(
      "absl", logging.INFO, os.path.join(log_setup.OWN_DIRS[0], "x.py"), 1,
      "own info", None, None))
  warnings.warn("fallback warning")  # As kvq_jax.kernels.dispatch warns.

app.run(main)
"""


def _app_stderr(tmp_path, *args: str) -> list[str]:
  script = tmp_path / "app.py"
  script.write_text(_APP)
  result = subprocess.run([sys.executable, str(script), *args],
                          capture_output=True, text=True, timeout=60,
                          check=True)
  return result.stderr.splitlines()


def test_app_default_is_quiet(tmp_path):
  lines = _app_stderr(tmp_path)
  assert len(lines) == 4, lines
  assert lines[0].startswith("W") and lines[0].endswith("] lib warning")
  assert lines[1] == "own info"  # kvq_jax's INFO: shown, without prefix.
  assert lines[2].endswith("UserWarning: fallback warning")


@pytest.mark.parametrize("args,count", [(("--log_level=info",), 4),
                                        (("--verbosity=0",), 4),
                                        (("--verbosity=1",), 5)])
def test_app_info_back_on_request(tmp_path, args, count):
  lines = _app_stderr(tmp_path, *args)
  for text in ("lib info", "jax info", "lib warning", "own info"):
    assert any(line.endswith("] " + text) for line in lines), (text, lines)
  assert len([l for l in lines if "lib debug" in l]) == count - 4
