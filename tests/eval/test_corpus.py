"""The default stdlib corpus and user-supplied evaluation files."""

from __future__ import annotations

import platform

import pytest

from kvq_jax.eval.corpus import (DEFAULT_STDLIB_FILES, default_corpus,
                                 load_eval_text)


def test_default_corpus_is_non_empty_deterministic_and_described():
  text, description = default_corpus()
  again, _ = default_corpus()
  assert text == again
  assert len(text) > 100_000  # Ten real modules, not a stub.
  assert description.startswith(f"python{platform.python_version()}-stdlib:")
  for name in DEFAULT_STDLIB_FILES:
    assert name in description
    assert f"# file: {name}\n" in text
  assert text.startswith("# file: textwrap.py\n")


@pytest.mark.parametrize("path", [None, ""])
def test_no_path_means_default(path):
  assert load_eval_text(path) == default_corpus()


def test_reads_a_file(tmp_path):
  file = tmp_path / "eval.txt"
  file.write_text("Some words.\nMore words.\n", encoding="utf-8")
  text, description = load_eval_text(str(file))
  assert text == "Some words.\nMore words.\n"
  assert description == str(file)


def test_missing_file(tmp_path):
  with pytest.raises(ValueError, match="no such file"):
    load_eval_text(str(tmp_path / "absent.txt"))


def test_empty_file(tmp_path):
  file = tmp_path / "empty.txt"
  file.write_text(" \n\t\n")
  with pytest.raises(ValueError, match="empty"):
    load_eval_text(file)


def test_binary_file_is_refused_naming_it_and_the_count(tmp_path):
  """Undecodable bytes become U+FFFD; more than 0.1% of them is not text."""
  file = tmp_path / "weights.bin"
  file.write_bytes(b"header\x00" + bytes(range(128, 256)) * 4 + b"tail\n")
  with pytest.raises(ValueError, match=r"eval_data='.*weights\.bin': 512 of "
                     r"its \d+ characters are not UTF-8 .*allowed: UTF-8"):
    load_eval_text(str(file))


def test_a_few_bad_bytes_in_real_text_are_kept(tmp_path):
  file = tmp_path / "mostly.txt"
  file.write_bytes(b"plain words " * 1000 + b"\xff")  # 1 in 12001: < 0.1%.
  text, _ = load_eval_text(file)
  assert text.count("\ufffd") == 1 and text.startswith("plain words")


def test_directory_is_not_a_file(tmp_path):
  with pytest.raises(ValueError, match=r"not a file; allowed: a UTF-8 text"):
    load_eval_text(tmp_path)
