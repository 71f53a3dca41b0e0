"""SentencePiece tokenizers from GGUF metadata (tokenizer.ggml.model 'llama').

llama.cpp's SPM tokenizer (`llm_tokenizer_spm_session` in llama-vocab.cpp),
which is what a GGUF 'llama' vocabulary means, works like this:

1. Tokens typed CONTROL (3), USER_DEFINED (4) or UNKNOWN (2) are cut out of the
   raw text first and emitted whole (longest first), e.g. `<start_of_turn>`,
   Gemma's '\\n\\n' or its whitespace runs '  ' (converters store user-defined
   '▁' as real spaces, so these match raw spaces, never the '▁' of step 2).
2. Every remaining fragment gets ' ' prepended when
   `tokenizer.ggml.add_space_prefix` is true (default true; at the start of
   the text and after every token of step 1), then each ' ' becomes '▁'.
3. The fragment is split into UTF-8 characters; repeatedly the adjacent pair
   whose concatenation is a vocab token with the highest
   `tokenizer.ggml.scores` entry is merged (ties: leftmost pair).
4. Symbols that are not tokens (characters outside the vocab) become their
   UTF-8 bytes as `<0xNN>` tokens (byte fallback).

Here that is a `tokenizers.Tokenizer` (the same construction as Hugging Face's
`SentencePieceExtractor` / transformers' GGUF converter): a BPE model whose
merges are every split of every token into two vocab tokens, ranked by the
merged token's score, so the best-scored pair is always merged first, with
`byte_fallback=True` for step 4; a normalizer for step 2 and added tokens for
step 1 (CONTROL/UNKNOWN special, USER_DEFINED not). Every character of a
multi-character token is itself a token in the vocabularies this targets
(Gemma 3: all 255474 normal tokens), so BPE's byte fallback on characters
outside the vocab loses no merge llama.cpp could make.

Ties. A BPE rank is a total order, llama.cpp breaks equal scores by position.
Merges are ranked by (score descending, merged token id ascending) and, for
the splits of one token, longest left piece first (the order transformers'
`generate_merges` gives). The two can only disagree when overlapping pairs
with equal scores compete, e.g. 'a'+'aa' vs 'aa'+'a' inside [a, aa, a];
Gemma's normal tokens have strictly decreasing, distinct scores.

Where transformers' GGUF converter (`gemma_tokenizer` in transformers 5.x)
differs, this follows llama.cpp: transformers respells Gemma's user-defined
space runs '  '..'<31 spaces>' as '▁▁'.. and leaves them to BPE merges, so a
run longer than 31 spaces splits differently (40 spaces: llama.cpp 31 + 9,
transformers 16 + 24; 32 spaces + 'x': llama.cpp [31 spaces, '▁x'],
transformers [16, 16, 'x']). Everything else, the whole WikiText-2 test file
included, gives the same ids (scripts/reference/tokenizer_ids.py). Added
tokens are matched leftmost-longest (`tokenizers`), llama.cpp cuts the
longest token out first; these agree unless two such tokens overlap.

Decoding: '▁' -> ' ', `<0xNN>` byte runs -> UTF-8, pieces fused; with
add_space_prefix one leading space is stripped (llama.cpp's detokenize does
the same), so `decode(encode(text)) == text` (with add_space_prefix, for text
without matched tokens: the space added after one is kept).
"""

from __future__ import annotations

import math
from typing import Sequence

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type) that are
# matched whole in the raw text; the others are NORMAL 1, UNUSED 5, BYTE 6.
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
_SPECIAL_TYPES = (UNKNOWN, CONTROL)
_SPACE = "\u2581"  # '▁', SentencePiece's whitespace symbol.


def spm_merges(tokens: Sequence[str],
               scores: Sequence[float]) -> list[tuple[str, str]]:
  """Every `(left, right)` whose concatenation is a token, best-ranked first.

  Args:
    tokens: the vocabulary, index = token id (no duplicates).
    scores: one score per token; a higher score merges first.

  Returns:
    BPE merges ordered by (score of left + right, descending; its id,
    ascending; len(left), descending).
  """
  vocab = set(tokens)
  order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
  merges = []
  for i in order:
    token = tokens[i]
    if len(token) < 2:
      continue
    for k in range(len(token) - 1, 0, -1):  # Longest left piece first.
      left = token[:k]
      if left in vocab:
        right = token[k:]
        if right in vocab:
          merges.append((left, right))
  return merges


def build_spm_tokenizer(tokens: Sequence[str], scores: Sequence[float],
                        token_types: Sequence[int] | None, *,
                        add_space_prefix: bool = True,
                        unk_id: int | None = None) -> tokenizers.Tokenizer:
  """A SentencePiece-BPE `tokenizers.Tokenizer` from GGUF-style vocab lists.

  Args:
    tokens: `tokenizer.ggml.tokens` ('▁' for spaces, `<0xNN>` byte tokens).
    scores: `tokenizer.ggml.scores`, one per token (merge priority).
    token_types: `tokenizer.ggml.token_type`, one per token, or None (then
      no token is matched whole in the raw text).
    add_space_prefix: `tokenizer.ggml.add_space_prefix` (llama.cpp's default
      for 'llama' vocabularies is True; Gemma sets False).
    unk_id: `tokenizer.ggml.unknown_token_id`; emitted only for a byte whose
      `<0xNN>` token is missing.

  Returns:
    The tokenizer; see the module docstring for its semantics.

  Raises:
    ValueError: empty vocab, duplicate tokens, list lengths that disagree,
      non-finite scores or an unk_id out of range.
  """
  n = len(tokens)
  if n == 0:
    raise ValueError("tokenizer.ggml.tokens is empty; a SentencePiece vocab "
                     "needs at least one token.")
  if len(scores) != n:
    raise ValueError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} "
                     "tokens; each token needs one score.")
  scores = [float(s) for s in scores]
  bad = next((i for i, s in enumerate(scores) if not math.isfinite(s)), None)
  if bad is not None:
    raise ValueError(f"tokenizer.ggml.scores[{bad}]={scores[bad]} for token "
                     f"{tokens[bad]!r}: scores must be finite.")
  if token_types is not None and len(token_types) != n:
    raise ValueError(f"tokenizer.ggml.token_type has {len(token_types)} "
                     f"entries for {n} tokens.")
  vocab = {}
  for i, token in enumerate(tokens):
    if vocab.setdefault(token, i) != i:
      raise ValueError(f"tokenizer.ggml.tokens[{i}]={token!r} duplicates "
                       f"token {vocab[token]}; ids would be ambiguous.")
  if unk_id is not None and not 0 <= unk_id < n:
    raise ValueError(f"tokenizer.ggml.unknown_token_id={unk_id} is outside the "
                     f"vocab [0, {n}).")
  hf = tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=spm_merges(tokens, scores),
      unk_token=None if unk_id is None else tokens[unk_id],
      fuse_unk=False, byte_fallback=True))
  replace = normalizers.Replace(" ", _SPACE)
  # Prepend before Replace: llama.cpp prefixes ' ' and then escapes it.
  hf.normalizer = (normalizers.Sequence([normalizers.Prepend(" "), replace])
                   if add_space_prefix else replace)
  steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(),
           decoders.Fuse()]
  if add_space_prefix:
    steps.append(decoders.Strip(content=" ", left=1, right=0))
  hf.decoder = decoders.Sequence(steps)
  if token_types is not None:
    special = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(token_types) if t in _SPECIAL_TYPES]
    user = [tokenizers.AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(token_types) if t == USER_DEFINED]
    hf.add_special_tokens(special)
    hf.add_tokens(user)
  return hf
