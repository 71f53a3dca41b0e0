"""Text tokenizers for kvq_jax checkpoints (GGUF metadata or tokenizer.json).

GGUF (`tokenizer.ggml.model == 'gpt2'`): a byte-level BPE is rebuilt from
`tokenizer.ggml.tokens` / `merges` with the `tokenizers` library. The
pre-tokenizer follows `tokenizer.ggml.pre` the way llama.cpp's
`llama-vocab.cpp` does:

* 'smollm' (also 'starcoder', 'refact'): llama.cpp splits on `\\p{N}` (every
  digit alone) and then applies the GPT-2 regex. Hugging Face's SmolLM2
  tokenizer.json expresses the same thing as
  Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)],
  which is what is built here, so ids match the model's own tokenizer.
* 'gpt2': ByteLevel with the GPT-2 regex alone.
* 'qwen2' / 'llama-bpe': Split on the respective tokenizer.json regex, then
  ByteLevel without its own regex.

Tokens typed CONTROL (3) become special added tokens (matched whole in the
input text, e.g. <|im_start|>), USER_DEFINED (4) plain added tokens.

GGUF (`tokenizer.ggml.model == 'llama'`, e.g. Gemma 3): a SentencePiece BPE
ranked by `tokenizer.ggml.scores`, with `<0xNN>` byte fallback; see
`kvq_jax.loaders.spm_tokenizer`. As in llama.cpp, `add_space_prefix` and
`add_bos_token` default to true when the file does not set them.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers

from kvq_jax.loaders import chat_template as chat_lib
from kvq_jax.loaders import gguf as gguf_loader
from kvq_jax.loaders import spm_tokenizer

_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                 r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|"
                 r"\s+")


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
  return pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def _split_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
  def build() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  return build


# tokenizer.ggml.pre -> pre-tokenizer factory (see the module docstring).
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "qwen2": _split_then_bytes(_QWEN2_REGEX),
    "llama-bpe": _split_then_bytes(_LLAMA3_REGEX),
}

_CONTROL, _USER_DEFINED = 3, 4
_META_FILE = "kvq_tokenizer.json"

# tokenizer.ggml.model values understood by `tokenizer_from_reader`.
GGUF_TOKENIZER_MODELS = {
    "gpt2": "byte-level BPE with tokenizer.ggml.merges",
    "llama": "SentencePiece BPE with tokenizer.ggml.scores and byte fallback",
}


class TextTokenizer:
  """A `tokenizers.Tokenizer` plus the ids and template a decoder loop needs."""

  def __init__(self, hf: tokenizers.Tokenizer, *, bos_id: int | None,
               eos_id: int | None, chat_template: str | None = None,
               add_bos: bool = False):
    if add_bos and bos_id is None:
      raise ValueError("TextTokenizer.add_bos=True needs a bos_id, got None.")
    self.hf = hf
    self.bos_id = bos_id
    self.eos_id = eos_id
    self.chat_template = chat_template
    self.add_bos = add_bos

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
    """Token ids of `text`; special tokens written in the text are matched."""
    ids = self.hf.encode(text, add_special_tokens=False).ids
    if self.add_bos if add_bos is None else add_bos:
      if self.bos_id is None:
        raise ValueError("encode(add_bos=True): this tokenizer has no bos_id.")
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.hf.decode([int(i) for i in ids],
                          skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    return self.hf.token_to_id(token)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                          add_generation_prompt: bool = True) -> str:
    """Renders a conversation in this tokenizer's chat format.

    jinja2 is not a dependency: the template's family (ChatML: SmolLM2,
    Qwen2.5; Gemma) is recognised and rendered by
    `kvq_jax.loaders.chat_template` (its docstring has the rules, including
    ChatML's default system prompt); another template is a ValueError.
    """
    return chat_lib.render_chat(self.chat_template, messages,
                                add_generation_prompt)

  def save(self, directory: str | os.PathLike[str]) -> None:
    """Writes tokenizer.json and kvq_tokenizer.json (ids, template)."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self.hf.save(str(directory / "tokenizer.json"))
    meta = {"bos_id": self.bos_id, "eos_id": self.eos_id,
            "chat_template": self.chat_template, "add_bos": self.add_bos}
    (directory / _META_FILE).write_text(json.dumps(meta))

  @classmethod
  def load(cls, directory: str | os.PathLike[str]) -> TextTokenizer:
    """Reads what `save` wrote."""
    directory = pathlib.Path(directory)
    meta = json.loads((directory / _META_FILE).read_text())
    return cls(tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json")),
               bos_id=meta["bos_id"], eos_id=meta["eos_id"],
               chat_template=meta["chat_template"], add_bos=meta["add_bos"])


def build_bpe_tokenizer(tokens: Sequence[str], merges: Sequence[str],
                        token_types: Sequence[int] | None,
                        pre: str) -> tokenizers.Tokenizer:
  """A byte-level BPE `tokenizers.Tokenizer` from GGUF-style vocab lists."""
  if pre not in PRE_TOKENIZERS:
    raise ValueError(f"tokenizer.ggml.pre={pre!r} is not supported; allowed: "
                     f"{sorted(PRE_TOKENIZERS)}.")
  vocab = {}
  for i, token in enumerate(tokens):
    vocab.setdefault(token, i)
  if len(vocab) != len(tokens):
    raise ValueError(f"tokenizer.ggml.tokens has {len(tokens) - len(vocab)} "
                     "duplicate entries; ids would be ambiguous.")
  merge_pairs = []
  for merge in merges:
    left, sep, right = merge.partition(" ")
    if not sep or not left or not right:
      raise ValueError(f"tokenizer.ggml.merges entry {merge!r}: expected "
                       "'left right'.")
    merge_pairs.append((left, right))
  hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs,
                                       fuse_unk=False, byte_fallback=False))
  hf.pre_tokenizer = PRE_TOKENIZERS[pre]()
  hf.decoder = decoders.ByteLevel()
  if token_types is not None:
    if len(token_types) != len(tokens):
      raise ValueError(f"tokenizer.ggml.token_type has {len(token_types)} "
                       f"entries for {len(tokens)} tokens.")
    added = [tokenizers.AddedToken(tokens[i], special=t == _CONTROL,
                                   normalized=False)
             for i, t in enumerate(token_types) if t in (_CONTROL, _USER_DEFINED)]
    hf.add_special_tokens([a for a in added if a.special])
    hf.add_tokens([a for a in added if not a.special])
  return hf


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> TextTokenizer:
  """The tokenizer stored in a GGUF file's `tokenizer.*` metadata."""
  return tokenizer_from_reader(gguf_loader.open_gguf(path), os.fspath(path))


def tokenizer_from_reader(reader: Any, path: str) -> TextTokenizer:
  """`load_gguf_tokenizer` on an opened `gguf.GGUFReader`."""
  value = lambda key: gguf_loader.metadata_value(reader, key)  # noqa: E731
  model = value("tokenizer.ggml.model")
  tokens = value("tokenizer.ggml.tokens")
  try:
    if model == "gpt2":
      merges = value("tokenizer.ggml.merges")
      if not tokens or merges is None:
        raise ValueError("tokenizer.ggml.tokens/merges are missing; a 'gpt2' "
                         "vocab needs both.")
      hf = build_bpe_tokenizer(tokens, merges,
                               value("tokenizer.ggml.token_type"),
                               value("tokenizer.ggml.pre") or "gpt2")
      add_bos_default = False
    elif model == "llama":
      scores = value("tokenizer.ggml.scores")
      if not tokens or scores is None:
        raise ValueError("tokenizer.ggml.tokens/scores are missing; a 'llama' "
                         "(SentencePiece) vocab needs both.")
      add_prefix = value("tokenizer.ggml.add_space_prefix")
      unk = value("tokenizer.ggml.unknown_token_id")
      hf = spm_tokenizer.build_spm_tokenizer(
          tokens, scores, value("tokenizer.ggml.token_type"),
          add_space_prefix=True if add_prefix is None else bool(add_prefix),
          unk_id=None if unk is None else int(unk))
      add_bos_default = True
    else:
      allowed = "; ".join(f"{name!r} ({what})"
                          for name, what in GGUF_TOKENIZER_MODELS.items())
      raise ValueError(f"tokenizer.ggml.model={model!r} is not supported; "
                       f"allowed: {allowed}.")
  except ValueError as e:
    raise ValueError(f"GGUF file {path!r}: {e}") from e
  bos, eos = value("tokenizer.ggml.bos_token_id"), value(
      "tokenizer.ggml.eos_token_id")
  add_bos = value("tokenizer.ggml.add_bos_token")
  add_bos = add_bos_default if add_bos is None else bool(add_bos)
  return TextTokenizer(
      hf, bos_id=None if bos is None else int(bos),
      eos_id=None if eos is None else int(eos),
      chat_template=value("tokenizer.chat_template"),
      add_bos=add_bos and bos is not None)


def _token_content(token: Any) -> str | None:
  return token.get("content") if isinstance(token, dict) else token


def load_hf_tokenizer(directory: str | os.PathLike[str]) -> TextTokenizer:
  """Tokenizer from a Hugging Face dir (tokenizer.json, tokenizer_config.json)."""
  directory = pathlib.Path(directory)
  path = directory / "tokenizer.json"
  if not path.is_file():
    raise ValueError(f"{str(path)!r} does not exist; a Hugging Face tokenizer "
                     "directory needs tokenizer.json.")
  try:
    hf = tokenizers.Tokenizer.from_file(str(path))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{str(path)!r} is not a valid tokenizer.json: {e}") from e
  tok_config, model_config = {}, {}
  for name, target in (("tokenizer_config.json", tok_config),
                       ("config.json", model_config)):
    if (directory / name).is_file():
      target.update(json.loads((directory / name).read_text()))

  def token_id(kind: str) -> int | None:
    content = _token_content(tok_config.get(f"{kind}_token"))
    if content is not None and hf.token_to_id(content) is not None:
      return hf.token_to_id(content)
    value = model_config.get(f"{kind}_token_id")
    if isinstance(value, list):
      value = value[0] if value else None
    return value

  bos, eos = token_id("bos"), token_id("eos")
  add_bos = tok_config.get("add_bos_token")
  if add_bos is None:  # e.g. Llama 3: the post-processor prepends BOS.
    add_bos = bos is not None and hf.encode("a").ids[:1] == [bos]
  template = tok_config.get("chat_template")
  if isinstance(template, list):  # Named templates: [{"name", "template"}].
    named = {t.get("name"): t.get("template") for t in template}
    template = named.get("default")
  return TextTokenizer(hf, bos_id=bos, eos_id=eos, chat_template=template,
                       add_bos=bool(add_bos) and bos is not None)
