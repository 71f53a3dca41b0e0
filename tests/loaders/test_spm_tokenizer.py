"""SentencePiece ('llama') GGUF tokenizers: a tiny synthetic vocab, Gemma 3."""

from __future__ import annotations

import gguf
import pytest

from kvq_jax import assets
from kvq_jax.loaders import spm_tokenizer
from kvq_jax.loaders import tokenizer as tokenizer_lib
from tests.loaders import gguf_header

# Tiny vocab: (token, score, type). Scores deliberately disagree with id
# order ("ab" has the lower id, "bc" the better score) so that a rank taken
# from ids instead of scores would give different ids.
_SPECIAL = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3),
            ("<unk>", 0.0, 2), ("<start_of_turn>", 0.0, 3),
            ("<end_of_turn>", 0.0, 3), ("\n", 0.0, 4), ("  ", 0.0, 4)]
_BYTES = [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
_NORMAL = [("▁", -1.0, 1), ("a", -2.0, 1), ("b", -3.0, 1), ("c", -4.0, 1),
           ("h", -5.0, 1), ("i", -6.0, 1), ("ab", -9.0, 1), ("bc", -7.0, 1),
           ("▁h", -8.0, 1), ("hi", -10.0, 1), ("▁hi", -11.0, 1)]
_VOCAB = _SPECIAL + _BYTES + _NORMAL
TOKENS = [t for t, _, _ in _VOCAB]
SCORES = [s for _, s, _ in _VOCAB]
TYPES = [k for _, _, k in _VOCAB]


def _id(token: str) -> int:
  return TOKENS.index(token)


def _byte(b: int) -> int:
  return _id(f"<0x{b:02X}>")


def _tiny(add_space_prefix: bool = False) -> tokenizer_lib.TextTokenizer:
  hf = spm_tokenizer.build_spm_tokenizer(
      TOKENS, SCORES, TYPES, add_space_prefix=add_space_prefix, unk_id=3)
  return tokenizer_lib.TextTokenizer(hf, bos_id=2, eos_id=1)


def _write_gguf(path, model: str = "llama", add_bos: bool | None = True):
  writer = gguf.GGUFWriter(str(path), "gemma3")
  writer.add_tokenizer_model(model)
  writer.add_tokenizer_pre("default")
  writer.add_token_list(TOKENS)
  writer.add_token_scores(SCORES)
  writer.add_token_types(TYPES)
  writer.add_bos_token_id(2)
  writer.add_eos_token_id(1)
  writer.add_unk_token_id(3)
  writer.add_pad_token_id(0)
  if add_bos is not None:
    writer.add_add_bos_token(add_bos)
  writer.add_add_space_prefix(False)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def test_merges_follow_scores_not_ids():
  tok = _tiny()
  # Pairs (a,b) -> 'ab' score -9 and (b,c) -> 'bc' score -7: 'bc' wins.
  assert tok.encode("abc") == [_id("a"), _id("bc")]
  assert tok.encode("ab") == [_id("ab")]
  # '▁'+'h' (-8) beats 'h'+'i' (-10); then '▁h'+'i' -> '▁hi' (-11).
  assert tok.encode(" hi") == [_id("▁hi")]
  assert tok.encode("hi") == [_id("hi")]
  merges = spm_tokenizer.spm_merges(TOKENS, SCORES)
  assert merges.index(("b", "c")) < merges.index(("▁", "h")) < merges.index(
      ("a", "b")) < merges.index(("h", "i")) < merges.index(("▁h", "i"))
  # '▁hi' splits two ways; the longer left piece ranks first.
  assert merges.index(("▁h", "i")) < merges.index(("▁", "hi"))


def test_spaces_become_meta_symbol_without_dummy_prefix():
  tok = _tiny()
  # No 'a▁' / '▁b' tokens: the space stays its own '▁'.
  assert tok.encode("a b") == [_id("a"), _id("▁"), _id("b")]
  assert tok.encode(" ") == [_id("▁")]
  # Two spaces are the user-defined token '  ', matched in the raw text.
  assert tok.encode("a  b") == [_id("a"), _id("  "), _id("b")]


def test_add_space_prefix_prepends_per_fragment():
  tok = _tiny(add_space_prefix=True)
  assert tok.encode("hi") == [_id("▁hi")]
  # As llama.cpp: a fragment after a matched token is prefixed too.
  assert tok.encode("<start_of_turn>hi") == [_id("<start_of_turn>"),
                                             _id("▁hi")]
  for text in ["hi", "hi abc", " hi"]:
    assert tok.decode(tok.encode(text)) == text


def test_byte_fallback_for_unknown_characters():
  tok = _tiny()
  # 'é' is not in the vocab: its UTF-8 bytes C3 A9 as <0xNN> tokens.
  assert tok.encode("é") == [_byte(0xC3), _byte(0xA9)]
  assert tok.encode("aéb") == [_id("a"), _byte(0xC3), _byte(0xA9), _id("b")]
  assert tok.encode("🍕") == [_byte(b) for b in "🍕".encode("utf-8")]


def test_control_tokens_matched_whole():
  tok = _tiny()
  ids = tok.encode("<start_of_turn>hi<end_of_turn>\n")
  assert ids == [_id("<start_of_turn>"), _id("hi"), _id("<end_of_turn>"),
                 _id("\n")]
  assert tok.encode("<unk>") == [3]  # UNKNOWN (2) is matched like CONTROL.
  assert tok.decode(ids) == "<start_of_turn>hi<end_of_turn>\n"
  assert tok.decode(ids, skip_special_tokens=True) == "hi\n"


def test_decode_round_trip():
  tok = _tiny()
  for text in ["abc hi  é\n", "  leading", "trailing ", "a\n\nb", "🍕 zz",
               ""]:
    assert tok.decode(tok.encode(text)) == text


def test_invalid_vocab_raises():
  with pytest.raises(ValueError, match=r"duplicates token 1"):
    spm_tokenizer.build_spm_tokenizer(["a", "b", "b"], [0.0] * 3, None)
  with pytest.raises(ValueError, match=r"scores has 2 entries for 3 tokens"):
    spm_tokenizer.build_spm_tokenizer(["a", "b", "c"], [0.0] * 2, None)
  with pytest.raises(ValueError, match=r"token_type has 1 entries for 2"):
    spm_tokenizer.build_spm_tokenizer(["a", "b"], [0.0] * 2, [1])
  with pytest.raises(ValueError, match=r"unknown_token_id=5 is outside"):
    spm_tokenizer.build_spm_tokenizer(["a", "b"], [0.0] * 2, None, unk_id=5)


def test_gguf_llama_dispatch_bos_and_save_load(tmp_path):
  tok = tokenizer_lib.load_gguf_tokenizer(_write_gguf(tmp_path / "t.gguf"))
  assert (tok.bos_id, tok.eos_id, tok.add_bos) == (2, 1, True)
  assert tok.encode("abc") == [2, _id("a"), _id("bc")]
  assert tok.encode("abc", add_bos=False) == [_id("a"), _id("bc")]
  tok.save(tmp_path / "saved")
  loaded = tokenizer_lib.TextTokenizer.load(tmp_path / "saved")
  for text in ["abc hi  é\n", "<start_of_turn>hi<end_of_turn>\n", " hi"]:
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text, add_bos=False)) == text
  # llama.cpp adds BOS to a 'llama' vocab whose file does not say otherwise.
  default = tokenizer_lib.load_gguf_tokenizer(
      _write_gguf(tmp_path / "d.gguf", add_bos=None))
  assert default.add_bos


def test_unsupported_tokenizer_model_names_allowed(tmp_path):
  path = _write_gguf(tmp_path / "bert.gguf", model="bert")
  with pytest.raises(ValueError, match=r"tokenizer.ggml.model='bert' is not "
                     r"supported; allowed: 'gpt2' .*; 'llama' "):
    tokenizer_lib.load_gguf_tokenizer(path)


# Ids of transformers' GGUF tokenizer (AutoTokenizer.from_pretrained(dir,
# gguf_file=...), transformers 5.24) on the Gemma 3 270M file, from
# scripts/reference/tokenizer_ids.py; llama.cpp's SPM algorithm (a Python
# port in the same script) gives the same ids.
GEMMA3_REFERENCE_IDS = {
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in "
    "April, and the clocks were striking thirteen.": [
        818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761, 1030,
        691, 496, 7804, 7445, 1719, 528, 5365, 236764, 532, 506, 76357, 964,
        21549, 59197, 236761],
    "   leading spaces": [139, 26016, 9952],
    "trailing spaces   ": [136697, 9952, 139],
    "multiple  spaces   between    words": [43819, 138, 35220, 139, 19195,
                                            140, 8992],
    "line one\nline two\n\nline four\ttabbed\t\tdouble\r\nwindows\n\n\n end "
    "\n": [1257, 886, 107, 1257, 1156, 108, 1257, 2390, 255968, 4823, 4250,
           255969, 7902, 251, 107, 33908, 109, 1345, 236743, 107],
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n": [
        2063, 10779, 236769, 236749, 236787, 801, 236768, 3921, 801, 236787,
        107, 140, 584, 538, 655, 236743, 236778, 236787, 107, 144, 2060, 538,
        107],
    "日本語のテキストです。中文文本，한국어 문장입니다.": [
        94951, 236945, 95830, 3652, 236924, 55041, 57489, 236900, 114216,
        237430, 16950, 237851, 15245, 236761],
    "I love 🍕 and 🚀! 👨‍👩‍👧 family, flags 🇯🇵, ✓ done.": [
        236777, 2765, 236743, 245414, 532, 236743, 242015, 236888, 236743,
        243874, 237243, 243767, 237243, 244814, 2523, 236764, 22680, 236743,
        247994, 245707, 236764, 71201, 3028, 236761],
    "Crème brûlée, naïve café, São Paulo, Ærøskøbing, Ελληνικά, Русский "
    "текст, עברית, العربية.": [
        15760, 9809, 125501, 155666, 236764, 120362, 33443, 236764, 30342,
        29150, 236764, 129016, 236750, 237465, 2592, 237465, 16983, 236764,
        23883, 109959, 42220, 236764, 214089, 94831, 236764, 11173, 104154,
        237270, 236764, 87595, 236761],
    # \x00 -> <0x00> (238); U+F0000 (not in the vocab) -> bytes F3 B0 80 80.
    "zero\u200bwidth, control \x00\x01\x7f, private \ue000\U000f0000, ancient "
    "𓀀𓁐, math 𝔸𝔹 ∮.": [
        13321, 237141, 2690, 236764, 2256, 236743, 238, 249732, 251541,
        236764, 2147, 236743, 245863, 481, 414, 366, 366, 236764, 12440,
        236743, 478, 385, 366, 366, 478, 385, 367, 382, 236764, 6596, 236743,
        249468, 255967, 236743, 252355, 236761],
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
    "4<end_of_turn>\n": [
        105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236778, 236881,
        106, 107, 105, 4368, 107, 236812, 106, 107],
}


@pytest.mark.slow
def test_gemma3_ids_match_reference(tmp_path):
  # Only the metadata is read, by gguf_header (gguf.GGUFReader, which
  # open_gguf wraps, spends ~12 s on this 262k-token vocab; open_gguf itself
  # is test_gguf.py's and test_real_smollm2.py's).
  reader = gguf_header.read_header(assets.resolve_model("gemma3-270m"))
  tok = tokenizer_lib.tokenizer_from_reader(reader, "gemma3-270m")
  assert (tok.bos_id, tok.eos_id, tok.add_bos) == (2, 1, True)
  assert tok.vocab_size == 262144
  tok.save(tmp_path)
  loaded = tokenizer_lib.TextTokenizer.load(tmp_path)
  for text, ids in GEMMA3_REFERENCE_IDS.items():
    assert tok.encode(text, add_bos=False) == ids, text
    assert tok.encode(text) == [2] + ids
    assert loaded.encode(text) == [2] + ids
    assert tok.decode(ids) == text
  # Runs of more than 31 spaces (Gemma's longest user-defined space token):
  # llama.cpp cuts the user-defined '  '..'<31 spaces>' tokens out of the raw
  # text longest first (31 + 9 spaces: ids 167, 145; a lone space then joins
  # the next word, '▁x' 1123). transformers instead respells them '▁▁..' and
  # leaves them to BPE merges ([152, 160] and [152, 152, 236781]); this
  # tokenizer follows llama.cpp.
  assert tok.encode("a" + " " * 40 + "b", add_bos=False) == [
      236746, 167, 145, 236763]
  assert tok.encode(" " * 32 + "x", add_bos=False) == [167, 1123]
