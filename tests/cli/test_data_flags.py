"""data_flags: --eval_data is checked as the flags are parsed."""

from __future__ import annotations

from absl import flags
import pytest

from kvq_jax.cli.data_flags import DEFINE_eval_data_flag


def _parse(*args: str) -> flags.FlagValues:
  values = flags.FlagValues()
  DEFINE_eval_data_flag(flag_values=values)
  values(["prog", *args])
  return values


def test_missing_and_binary_files_fail_as_the_flags_parse(tmp_path):
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r"--eval_data=.*absent\.txt: eval_data=.*: no "
                     r"such file"):
    _parse(f"--eval_data={tmp_path / 'absent.txt'}")
  binary = tmp_path / "data.bin"
  binary.write_bytes(bytes(range(256)) * 8)
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r"1024 of its .* characters are not UTF-8"):
    _parse(f"--eval_data={binary}")


def test_no_flag_and_a_text_file_pass(tmp_path):
  assert _parse().eval_data is None
  text = tmp_path / "eval.txt"
  text.write_text("Some words.\n", encoding="utf-8")
  assert _parse(f"--eval_data={text}").eval_data == str(text)
