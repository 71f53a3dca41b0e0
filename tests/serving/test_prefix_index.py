"""The prefix cache's keys and index on hand-checked cases: chained keys,
longest-run lookup, one index reference per page, LRU eviction that never
takes a page a slot uses. (The randomized schedules are in test_pages.py.)
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvq_jax.serving.pages import BlockTables, PageAllocator
from kvq_jax.serving.prefix_index import PrefixIndex, page_keys

PAGE_SIZE = 4


def _setup(num_pages=16, capacity=None):
  allocator = PageAllocator(num_pages)
  tables = BlockTables(allocator, 4, 4, PAGE_SIZE)
  return allocator, tables, PrefixIndex(allocator, PAGE_SIZE, capacity)


def _admit(tables, slot, tokens):
  assert tables.reserve(slot, len(tokens)) is None
  return tables.pages(slot)


# --- page_keys -------------------------------------------------------------


def test_page_keys_are_the_chained_sha256_of_int32_pages():
  tokens = [1, 2, 3, 4, 5, 6, 7, 8]
  first = hashlib.sha256(np.array([1, 2, 3, 4], "<i4").tobytes()).digest()
  second = hashlib.sha256(
      first + np.array([5, 6, 7, 8], "<i4").tobytes()).digest()
  assert page_keys(tokens, 4) == [first, second]
  assert page_keys(np.array(tokens, np.int64), 4) == [first, second]


def test_equal_prefixes_give_equal_keys():
  a = page_keys([1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9], 4)
  b = page_keys([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0], 4)
  assert a[:2] == b[:2] and a[2] != b[2]


def test_a_change_in_page_0_changes_every_later_key():
  a = page_keys([1, 2, 3, 4] + [5] * 8, 4)
  b = page_keys([1, 2, 3, 0] + [5] * 8, 4)
  assert all(x != y for x, y in zip(a, b))
  # The same later pages under a different first page: different keys.
  assert len(set(a)) == 3


def test_a_partial_page_gets_no_key():
  assert page_keys([1, 2, 3], 4) == []
  assert len(page_keys([1, 2, 3, 4, 5, 6, 7], 4)) == 1
  assert page_keys([], 4) == []


def test_page_keys_rejects_bad_tokens_and_page_sizes():
  with pytest.raises(ValueError, match="positive"):
    page_keys([1, 2], 0)
  with pytest.raises(ValueError, match="integers"):
    page_keys([1.5, 2.0], 1)
  with pytest.raises(ValueError, match="integers"):
    page_keys([[1, 2]], 1)
  with pytest.raises(ValueError, match="int32"):
    page_keys([2**31], 1)


# --- PrefixIndex -----------------------------------------------------------


def test_insert_retains_full_pages_and_lookup_finds_the_longest_run():
  allocator, tables, index = _setup()
  tokens = list(range(10))  # two full pages and a partial one
  pages = _admit(tables, 0, tokens)
  index.insert(tokens, pages)
  assert len(index) == 2
  assert index.cached_pages == (2, 1)  # LRU first: the head is the newest
  assert [allocator.refcount(p) for p in pages] == [2, 2, 1]
  assert index.lookup(tokens) == [1, 2]
  assert index.lookup(list(range(8)) + [0, 0, 0, 0]) == [1, 2]
  assert index.lookup(list(range(6))) == [1]
  assert index.lookup([0, 1, 2, 9, 4, 5, 6, 7]) == []
  assert [allocator.refcount(p) for p in pages] == [2, 2, 1]  # no retains
  tables.check()
  index.check()


def test_a_key_already_cached_is_left_as_is():
  allocator, tables, index = _setup()
  tokens = list(range(8))
  first = _admit(tables, 0, tokens)
  second = _admit(tables, 1, tokens)  # the same prefix computed again
  index.insert(tokens, first)
  index.insert(tokens, second)
  assert index.lookup(tokens) == list(first)
  assert [allocator.refcount(p) for p in first + second] == [2, 2, 1, 1]
  tables.check()


def test_a_reused_prefix_is_shared_and_extended():
  allocator, tables, index = _setup()
  prompt = list(range(8))
  index.insert(prompt, _admit(tables, 0, prompt))
  longer = prompt + [8, 9, 10, 11, 12]
  hit = index.lookup(longer[:-1])
  assert hit == [1, 2]
  tables.attach(1, hit)
  assert tables.reserve(1, len(longer)) is None
  index.insert(longer, tables.pages(1))  # registers only the new page 3
  assert tables.pages(1) == (1, 2, 3, 4)
  assert index.cached_pages == (3, 2, 1)
  assert [allocator.refcount(p) for p in (1, 2, 3, 4)] == [3, 3, 2, 1]
  tables.check()
  index.check()


def test_insert_errors_change_nothing():
  allocator, tables, index = _setup()
  tokens = list(range(8))
  pages = _admit(tables, 0, tokens)
  with pytest.raises(ValueError, match="only 1 page"):
    index.insert(tokens, pages[:1])
  with pytest.raises(ValueError, match="not an allocated page"):
    index.insert(tokens, [pages[0], 9])
  with pytest.raises(ValueError, match="reserved"):
    index.insert(tokens, [0, pages[1]])
  with pytest.raises(ValueError, match="another prefix"):
    index.insert(tokens, [pages[0], pages[0]])
  assert len(index) == 0
  assert [allocator.refcount(p) for p in pages] == [1, 1]
  index.insert(tokens, pages)
  with pytest.raises(ValueError, match="another prefix"):
    index.insert([9] * 4, pages[:1])
  index.check()


def test_evict_frees_only_pages_no_slot_uses_tail_first():
  allocator, tables, index = _setup()
  tokens = list(range(12))
  pages = _admit(tables, 0, tokens)  # 1, 2, 3
  index.insert(tokens, pages)
  assert index.evict(3) == 0  # the slot still uses every page
  assert index.num_evictable == 0
  tables.free(0)
  assert index.num_evictable == 3
  assert index.evict(1) == 1
  assert index.cached_pages == (2, 1)  # the chain's tail went first
  assert allocator.refcount(3) == 0
  assert index.lookup(tokens) == [1, 2]
  tables.attach(1, [1])
  assert index.evict(5) == 1  # page 1 is attached: only page 2 goes
  assert index.cached_pages == (1,)
  assert allocator.num_free == 14
  tables.free(1)
  assert index.evict(5) == 1
  assert len(index) == 0 and allocator.num_free == 15
  tables.check()
  index.check()


def test_lookup_stops_at_the_first_missing_key():
  allocator, tables, index = _setup()
  tokens = list(range(8))
  first = _admit(tables, 0, tokens[:4])
  index.insert(tokens[:4], first)  # key 0 -> page 1
  second = _admit(tables, 1, tokens)  # pages 2, 3
  index.insert(tokens, second)  # key 0 kept as page 1, key 1 -> page 3
  assert index.lookup(tokens) == [1, 3]
  tables.free(0)
  assert index.evict(1) == 1  # page 1: its slot is gone; page 3 is in use
  assert index.cached_pages == (3,)
  assert index.lookup(tokens) == []  # key 1 is held, but not key 0
  tables.check()
  index.check()


def test_lookup_marks_pages_recently_used():
  _, tables, index = _setup()
  a, b = [1] * 4, [2] * 4
  index.insert(a, _admit(tables, 0, a))  # page 1
  index.insert(b, _admit(tables, 1, b))  # page 2
  tables.free(0)
  tables.free(1)
  assert index.lookup(a) == [1]
  assert index.evict(1) == 1
  assert index.cached_pages == (1,)


def test_capacity_evicts_least_recently_used_after_insert():
  allocator, tables, index = _setup(capacity=2)
  a, b = [1] * 8, [2] * 8
  index.insert(a, _admit(tables, 0, a))  # pages 1, 2
  tables.free(0)
  index.insert(b, _admit(tables, 1, b))  # pages 3, 4: a's pages go
  assert index.cached_pages == (4, 3)
  assert allocator.num_free == 13
  assert index.lookup(a) == []
  # Pages a slot uses stay, even past the capacity.
  index.insert([3] * 4, _admit(tables, 2, [3] * 4))  # page 1
  assert len(index) == 3 and index.num_evictable == 0
  tables.check()
  index.check()


def test_constructor_and_evict_errors():
  allocator = PageAllocator(4)
  with pytest.raises(ValueError, match="positive"):
    PrefixIndex(allocator, 0)
  with pytest.raises(ValueError, match="capacity_pages"):
    PrefixIndex(allocator, 4, -1)
  with pytest.raises(ValueError, match="PageAllocator"):
    PrefixIndex(None, 4)
  with pytest.raises(ValueError, match=">= 0"):
    PrefixIndex(allocator, 4).evict(-1)
