"""A tiny random llama checkpoint whose word-level tokenizer knows the
passkey prompt's words and every digit (one token per word or digit).

The weights and config are `tests.fixtures.tiny_hf_model`'s (V=64,
max_position_embeddings=512); only tokenizer.json differs, so prompt
lengths are easy to count by hand: `count_tokens` is the number of words,
punctuation marks and digits of a text.
"""

from __future__ import annotations

import pathlib
import re

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from kvq_jax.longctx import passkey
from tests.fixtures import tiny_hf_model

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 (the config's bos / eos).
TRAINING = (passkey.TASK, passkey.FILLER_SENTENCES, passkey.NEEDLE,
            passkey.QUESTION, "0 1 2 3 4 5 6 7 8 9")


def count_tokens(text: str) -> int:
  """Tokens of `text` under this tokenizer (words, punctuation, digits)."""
  return len(re.findall(r"\d|[^\W\d]+|[^\w\s]+", text))


def train_tokenizer() -> Tokenizer:
  tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Whitespace(),
      pre_tokenizers.Digits(individual_digits=True)])
  trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS,
                                      show_progress=False)
  tok.train_from_iterator([t.replace("{key}", "0") for t in TRAINING],
                          trainer)
  if tok.get_vocab_size() > tiny_hf_model.V:
    raise AssertionError(
        f"tiny tokenizer has {tok.get_vocab_size()} > {tiny_hf_model.V}")
  return tok


def write_model(directory: pathlib.Path, seed: int = 0) -> pathlib.Path:
  tiny_hf_model.write_tiny_model(directory, seed)
  train_tokenizer().save(str(directory / "tokenizer.json"))
  return directory


def write_text(path: pathlib.Path, repeats: int = 20) -> pathlib.Path:
  """A text of known words only (task and filler sentences, repeated)."""
  unit = passkey.TASK + passkey.FILLER_SENTENCES + "\n"
  path.write_text(unit * repeats, encoding="utf-8")
  return path
