"""One-off parity check: Gemma 3 GGUF tokenizer ids, kvq_jax vs references.

Two steps, two environments (transformers is NOT a kvq_jax dependency):

1. Reference ids from transformers' tokenizer built from the same GGUF
   (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`), in an environment
   holding transformers + gguf + sentencepiece, e.g. /tmp/refvenv:

     /tmp/refvenv/bin/python scripts/reference/tokenizer_ids.py reference \\
         --gguf=~/.cache/kvq_jax/models/gemma-3-270m-q4_k_m.gguf \\
         --wiki=../shared/data/wikitext-2-raw/wiki.test.raw \\
         --out=/tmp/gemma3_tokenizer_ids.json [--full_wiki]

   Prints the ids of every fixed text and writes them (with the texts) to
   --out. --full_wiki also encodes the whole WikiText-2 test file.

2. Comparison, in the kvq_jax environment:

     .venv/bin/python scripts/reference/tokenizer_ids.py compare \\
         --gguf=~/.cache/kvq_jax/models/gemma-3-270m-q4_k_m.gguf \\
         --ids=/tmp/gemma3_tokenizer_ids.json

   Encodes the same texts with kvq_jax (`open_gguf` + `tokenizer_from_reader`)
   and with `llama_cpp_spm_ids` below, a line-by-line Python port of
   llama.cpp's SPM path (`tokenizer_st_partition` + `llm_tokenizer_spm_session`
   in llama-vocab.cpp), and reports every difference among the three.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import time

# The fixed texts: name -> text. "wiki_20k" is added from --wiki.
TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It was a bright "
               "cold day in April, and the clocks were striking thirteen.",
    "leading_spaces": "   leading spaces",
    "trailing_spaces": "trailing spaces   ",
    "multiple_spaces": "multiple  spaces   between    words",
    "space_runs_long": "a" + " " * 40 + "b" + " " * 32 + "c" + " " * 31 + "d",
    "single_space": " ",
    "newlines_tabs": "line one\nline two\n\nline four\ttabbed\t\tdouble\r\n"
                     "windows\n\n\n end \n",
    "digits": "In 2024 there were 366 days; pi is 3.14159 and 1,000,000 is "
              "a million. Call 555-0199 at 07:45.",
    "punctuation": "Hello, world... (really?) \"quoted\" 'single' -- dash; "
                   "colon: [brackets] {braces} <angle> @#$%^&*_+=|\\/~`!",
    "code": "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    "
            "return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in "
            "range(10)])  # 0 1 1 2 3\n",
    "cjk": "日本語のテキストです。中文文本，한국어 문장입니다.",
    "emoji": "I love 🍕 and 🚀! 👨‍👩‍👧 family, flags 🇯🇵, ✓ done.",
    "accents": "Crème brûlée, naïve café, São Paulo, Ærøskøbing, Ελληνικά, "
               "Русский текст, עברית, العربية.",
    "rare_chars": "zero\u200bwidth, control \x00\x01\x7f, private \ue000"
                  "\U000f0000, ancient 𓀀𓁐, math 𝔸𝔹 ∮.",
    "chat": "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
            "<start_of_turn>model\n4<end_of_turn>\n",
    "special_literals": "<bos>x<eos> <unused0> <table><tr>[multimodal]</tr>"
                        " <0x41> <mask>",
    "empty": "",
}
WIKI_CHARS = 20_000
_SPACE = "\u2581"


def reference(args: argparse.Namespace) -> None:
  """Step 1: transformers' ids for TEXTS (+ WikiText) -> JSON."""
  # pylint: disable-next=import-outside-toplevel
  from transformers import AutoTokenizer
  path = os.path.expanduser(args.gguf)
  started = time.perf_counter()
  tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                            gguf_file=os.path.basename(path))
  print(f"transformers {type(tokenizer).__name__} built in "
        f"{time.perf_counter() - started:.1f} s")
  with open(os.path.expanduser(args.wiki), encoding="utf-8") as f:
    wiki = f.read()
  texts = dict(TEXTS, wiki_20k=wiki[:WIKI_CHARS])
  out = {"texts": texts, "ids": {}, "with_bos": {}}
  for name, text in texts.items():
    ids = tokenizer.encode(text, add_special_tokens=False)
    out["ids"][name] = ids
    out["with_bos"][name] = tokenizer.encode(text)
    if name != "wiki_20k":
      print(f"{name}: {ids}")
    else:
      print(f"{name}: {len(ids)} ids, first 40 {ids[:40]}")
  if args.full_wiki:
    started = time.perf_counter()
    ids = tokenizer.encode(wiki, add_special_tokens=False)
    print(f"full wiki.test.raw ({len(wiki)} chars): {len(ids)} ids in "
          f"{time.perf_counter() - started:.1f} s")
    out["full_wiki"] = {"path": os.path.abspath(os.path.expanduser(args.wiki)),
                        "ids": ids}
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(out, f)
  print(f"wrote {args.out}")


def llama_cpp_spm_ids(text: str, tokens: list[str], scores: list[float],
                      types: list[int], add_space_prefix: bool) -> list[int]:
  """llama.cpp's SPM tokenization of `text` (parse_special, no BOS/EOS)."""
  token_to_id = {t: i for i, t in enumerate(tokens)}
  # tokenizer_st_partition: CONTROL | USER_DEFINED | UNKNOWN, longest (bytes)
  # first; each is cut out of every raw fragment, left to right. Tokens absent
  # from the text cannot cut anything, so only present ones are tried.
  special = sorted((i for i, t in enumerate(types) if t in (2, 3, 4)),
                   key=lambda i: -len(tokens[i].encode("utf-8")))
  fragments: list[str | int] = [text] if text else []
  for i in special:
    piece = tokens[i]
    if not piece or piece not in text:
      continue
    split: list[str | int] = []
    for fragment in fragments:
      if isinstance(fragment, int):
        split.append(fragment)
        continue
      parts = fragment.split(piece)
      for k, part in enumerate(parts):
        if k:
          split.append(i)
        if part:
          split.append(part)
    fragments = split
  output: list[int] = []
  prev_special = True
  for fragment in fragments:
    if isinstance(fragment, int):
      output.append(fragment)
      prev_special = True
      continue
    if add_space_prefix and prev_special:
      fragment = " " + fragment
    output.extend(_spm_session(fragment.replace(" ", _SPACE), token_to_id,
                               scores))
    prev_special = False
  return output


def _spm_session(text: str, token_to_id: dict[str, int],
                 scores: list[float]) -> list[int]:
  """llm_tokenizer_spm_session::tokenize on one escaped fragment."""
  symbols = [[i - 1, i + 1 if i + 1 < len(text) else -1, i, 1]
             for i in range(len(text))]  # prev, next, start, n (in chars).
  queue: list[tuple[float, int, int, int]] = []
  rev_merge: dict[str, tuple[int, int]] = {}

  def try_add_bigram(left: int, right: int) -> None:
    if left == -1 or right == -1:
      return
    start = symbols[left][2]
    piece = text[start:start + symbols[left][3] + symbols[right][3]]
    token = token_to_id.get(piece)
    if token is None:
      return
    # Max score first, then smallest left index (llm_bigram_spm::comparator).
    heapq.heappush(queue, (-scores[token], left, right, len(piece)))
    rev_merge[piece] = (left, right)

  for i in range(1, len(symbols)):
    try_add_bigram(i - 1, i)
  while queue:
    _, left, right, size = heapq.heappop(queue)
    left_sym, right_sym = symbols[left], symbols[right]
    if left_sym[3] == 0 or right_sym[3] == 0 or (
        left_sym[3] + right_sym[3] != size):
      continue
    left_sym[3] += right_sym[3]
    right_sym[3] = 0
    left_sym[1] = right_sym[1]
    if right_sym[1] >= 0:
      symbols[right_sym[1]][0] = left
    try_add_bigram(left_sym[0], left)
    try_add_bigram(left, left_sym[1])

  output: list[int] = []

  def resegment(index: int) -> None:
    start, n = symbols[index][2], symbols[index][3]
    piece = text[start:start + n]
    token = token_to_id.get(piece)
    if token is not None:
      output.append(token)
      return
    merged = rev_merge.get(piece)
    if merged is None:
      output.extend(token_to_id[f"<0x{b:02X}>"] for b in piece.encode("utf-8"))
      return
    resegment(merged[0])
    resegment(merged[1])

  i = 0 if symbols else -1
  while i != -1:
    resegment(i)
    i = symbols[i][1]
  return output


def _first_difference(a: list[int], b: list[int]) -> str:
  k = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y),
           min(len(a), len(b)))
  return (f"lengths {len(a)} vs {len(b)}, first difference at {k}: "
          f"{a[max(0, k - 3):k + 5]} vs {b[max(0, k - 3):k + 5]}")


def compare(args: argparse.Namespace) -> int:
  """Step 2: kvq_jax vs transformers vs the llama.cpp port."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  # pylint: disable=import-outside-toplevel
  from kvq_jax.loaders import gguf as gguf_loader
  from kvq_jax.loaders import tokenizer as tokenizer_lib
  # pylint: enable=import-outside-toplevel
  with open(args.ids, encoding="utf-8") as f:
    ref = json.load(f)
  path = os.path.expanduser(args.gguf)
  started = time.perf_counter()
  reader = gguf_loader.open_gguf(path)
  opened = time.perf_counter()
  tok = tokenizer_lib.tokenizer_from_reader(reader, path)
  built = time.perf_counter()
  print(f"kvq_jax: open_gguf {opened - started:.1f} s, tokenizer_from_reader "
        f"{built - opened:.1f} s")
  value = lambda key: gguf_loader.metadata_value(reader, key)  # noqa: E731
  tokens = value("tokenizer.ggml.tokens")
  scores = value("tokenizer.ggml.scores")
  types = value("tokenizer.ggml.token_type")
  prefix = value("tokenizer.ggml.add_space_prefix")
  prefix = True if prefix is None else bool(prefix)

  cases = list(ref["texts"].items())
  if "full_wiki" in ref:
    with open(ref["full_wiki"]["path"], encoding="utf-8") as f:
      cases.append(("full_wiki", f.read()))
  failures, total_ids, vs_hf, vs_cpp = 0, 0, 0, 0
  for name, text in cases:
    hf_ids = (ref["full_wiki"]["ids"] if name == "full_wiki"
              else ref["ids"][name])
    started = time.perf_counter()
    ours = tok.encode(text, add_bos=False)
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    cpp = llama_cpp_spm_ids(text, tokens, scores, types, prefix)
    cpp_s = time.perf_counter() - started
    total_ids += len(hf_ids)
    status = []
    if ours != hf_ids:
      status.append(f"kvq != transformers ({_first_difference(ours, hf_ids)})")
    if ours != cpp:
      status.append(f"kvq != llama.cpp port ({_first_difference(ours, cpp)})")
    if cpp != hf_ids:
      status.append("llama.cpp port != transformers "
                    f"({_first_difference(cpp, hf_ids)})")
    if name in ref.get("with_bos", {}) and (
        tok.encode(text) != ref["with_bos"][name]):
      status.append(f"with BOS: kvq {tok.encode(text)[:4]} vs transformers "
                    f"{ref['with_bos'][name][:4]}")
    if tok.decode(ours) != text:
      status.append("decode(encode(text)) != text")
    vs_hf += ours != hf_ids
    vs_cpp += ours != cpp
    failures += bool(status)
    timing = f"kvq {ours_s * 1e3:.0f} ms, port {cpp_s:.1f} s"
    print(f"{name}: {len(ours)} ids ({timing}): "
          + ("; ".join(status) if status else "all three equal"))
  print(f"{len(cases)} texts, {total_ids} transformers ids: kvq_jax differs "
        f"from transformers on {vs_hf}, from the llama.cpp port on {vs_cpp}; "
        f"{failures} texts with any difference")
  return 1 if failures else 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="step", required=True)
  ref = sub.add_parser("reference", help="transformers ids -> JSON")
  ref.add_argument("--gguf", required=True)
  ref.add_argument("--wiki", required=True)
  ref.add_argument("--out", required=True)
  ref.add_argument("--full_wiki", action="store_true")
  cmp = sub.add_parser("compare", help="kvq_jax and llama.cpp port vs JSON")
  cmp.add_argument("--gguf", required=True)
  cmp.add_argument("--ids", required=True)
  args = parser.parse_args()
  if args.step == "reference":
    reference(args)
    return 0
  return compare(args)


if __name__ == "__main__":
  sys.exit(main())
