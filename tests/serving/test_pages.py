"""The page allocator and block tables on small hand-checked cases, then a
stateful property test: random admit / grow / fork / free / prefix insert /
lookup+attach / evict schedules against a model of the device's pages.

The model writes each slot's tokens into a simulated page pool, so sharing
mistakes show up as wrong contents: a slot only ever writes into a page it
holds alone, every slot reads back its own tokens, and every prefix hit
holds the tokens it was looked up by.
"""

from __future__ import annotations

import collections

import hypothesis
import numpy as np
import pytest
from hypothesis import stateful
from hypothesis import strategies as st

from kvq_jax.serving.pages import (EXTERNAL, BlockTables, Holder,
                                   OutOfPages, PageAllocator)
from kvq_jax.serving.prefix_index import PrefixIndex


def _tables(num_pages=8, max_slots=3, max_pages=4, page_size=4):
  allocator = PageAllocator(num_pages)
  return allocator, BlockTables(allocator, max_slots, max_pages, page_size)


# --- PageAllocator ---------------------------------------------------------


def test_allocates_lowest_free_page_first_and_never_page_0():
  allocator = PageAllocator(6)
  assert (allocator.num_pages, allocator.num_free, allocator.num_used) == (
      6, 5, 0)
  assert allocator.allocate(2) == [1, 2]
  assert allocator.allocate(0) == []
  assert allocator.allocate(1) == [3]
  allocator.release([2])
  assert allocator.free_pages == (2, 4, 5)
  assert allocator.allocate(2) == [2, 4]
  assert (allocator.num_free, allocator.num_used) == (1, 4)
  assert allocator.refcount(0) == 0
  allocator.check()


def test_out_of_pages_is_all_or_nothing():
  allocator = PageAllocator(4)
  assert allocator.allocate(2) == [1, 2]
  assert allocator.allocate(2) == OutOfPages(needed=2, free=1)
  assert allocator.num_free == 1
  assert allocator.free_pages == (3,)
  assert allocator.allocate(1) == [3]
  assert allocator.allocate(1) == OutOfPages(needed=1, free=0)


def test_release_returns_a_page_only_at_refcount_0():
  allocator = PageAllocator(4)
  [page] = allocator.allocate(1)
  allocator.retain([page])
  assert allocator.refcount(page) == 2
  allocator.release([page])
  assert allocator.refcount(page) == 1
  assert page not in allocator.free_pages
  allocator.release([page])
  assert allocator.refcount(page) == 0
  assert allocator.num_free == 3
  allocator.check()


def test_double_free_and_reserved_or_free_pages_are_value_errors():
  allocator = PageAllocator(4)
  [page] = allocator.allocate(1)
  allocator.release([page])
  with pytest.raises(ValueError, match="already free"):
    allocator.release([page])
  with pytest.raises(ValueError, match="is free"):
    allocator.retain([page])
  with pytest.raises(ValueError, match="reserved"):
    allocator.retain([0])
  with pytest.raises(ValueError, match="reserved"):
    allocator.release([0])
  with pytest.raises(ValueError, match="out of range"):
    allocator.retain([4])
  with pytest.raises(ValueError, match="at least 2"):
    PageAllocator(1)
  with pytest.raises(ValueError, match=">= 0"):
    allocator.allocate(-1)
  with pytest.raises(ValueError, match="bool"):
    allocator.allocate(True)


def test_a_failed_retain_or_release_changes_nothing():
  allocator = PageAllocator(5)
  allocator.allocate(2)  # pages 1, 2
  with pytest.raises(ValueError):
    allocator.retain([1, 3])  # 3 is free
  assert allocator.refcount(1) == 1
  with pytest.raises(ValueError, match="double free"):
    allocator.release([1, 2, 2])
  assert (allocator.refcount(1), allocator.refcount(2)) == (1, 1)
  allocator.check()


def test_a_holder_cannot_release_another_holders_reference():
  allocator = PageAllocator(4)
  mine, theirs = Holder("mine"), Holder("mine")  # same name, two holders
  [page] = allocator.allocate(1, mine)
  allocator.retain([page], theirs)
  allocator.release([page], theirs)
  with pytest.raises(ValueError, match="double free"):
    allocator.release([page], theirs)  # the page is still held by `mine`
  with pytest.raises(ValueError, match="double free"):
    allocator.release([page])  # EXTERNAL holds none either
  assert allocator.holdings(mine) == {page: 1}
  assert allocator.holdings(EXTERNAL) == {}
  allocator.release([page], mine)
  assert allocator.num_free == 3
  allocator.check()


# --- BlockTables -----------------------------------------------------------


def test_reserve_grows_a_slot_page_by_page():
  allocator, tables = _tables()
  assert tables.is_empty(1)
  assert tables.reserve(1, 0) is None and tables.is_empty(1)
  assert tables.reserve(1, 5) is None
  assert tables.pages(1) == (1, 2)
  assert tables.num_tokens_capacity(1) == 8
  assert tables.reserve(1, 8) is None  # already covered: no new page
  assert tables.pages(1) == (1, 2)
  assert tables.reserve(0, 1) is None
  assert tables.reserve(1, 9) is None
  assert tables.pages(1) == (1, 2, 4)
  np.testing.assert_array_equal(
      tables.table, [[3, 0, 0, 0], [1, 2, 4, 0], [0, 0, 0, 0]])
  assert tables.table.dtype == np.int32
  tables.check()


def test_reserve_out_of_pages_changes_nothing():
  allocator, tables = _tables(num_pages=5)  # 4 usable pages
  assert tables.reserve(0, 8) is None
  before = tables.table
  assert tables.reserve(1, 12) == OutOfPages(needed=3, free=2)
  np.testing.assert_array_equal(tables.table, before)
  assert tables.is_empty(1)
  assert allocator.num_free == 2
  tables.check()


def test_reserve_past_max_tokens_and_bad_slots_are_value_errors():
  _, tables = _tables()
  with pytest.raises(ValueError, match="0..16"):
    tables.reserve(0, 17)
  with pytest.raises(ValueError, match="0..16"):
    tables.reserve(0, -1)
  with pytest.raises(ValueError, match="out of range"):
    tables.reserve(3, 1)
  with pytest.raises(ValueError, match="out of range"):
    tables.pages(-1)
  with pytest.raises(ValueError, match="positive"):
    BlockTables(PageAllocator(4), 2, 0, 4)


def test_fork_shares_full_pages_and_copies_only_the_partial_page():
  allocator, tables = _tables()
  tables.reserve(0, 10)  # pages 1, 2, 3; 10 tokens
  assert tables.fork(0, 1, 10) == [(3, 4)]
  assert tables.pages(1) == (1, 2, 4)
  assert [allocator.refcount(p) for p in (1, 2, 3, 4)] == [2, 2, 1, 1]
  assert tables.fork(0, 2, 8) == []  # a page boundary: nothing to copy
  assert tables.pages(2) == (1, 2)
  assert [allocator.refcount(p) for p in (1, 2)] == [3, 3]
  tables.check()
  tables.free(0)
  assert [allocator.refcount(p) for p in (1, 2, 3)] == [2, 2, 0]
  tables.free(1)
  tables.free(2)
  assert allocator.num_free == 7
  tables.check()


def test_fork_out_of_pages_changes_nothing():
  allocator, tables = _tables(num_pages=4)  # 3 usable pages
  tables.reserve(0, 10)
  assert tables.fork(0, 1, 9) == OutOfPages(needed=1, free=0)
  assert tables.is_empty(1)
  assert [allocator.refcount(p) for p in (1, 2, 3)] == [1, 1, 1]
  assert tables.fork(0, 1, 4) == []  # only shared pages: fits
  tables.check()


def test_fork_errors():
  _, tables = _tables()
  tables.reserve(0, 6)
  tables.reserve(1, 1)
  with pytest.raises(ValueError, match="itself"):
    tables.fork(0, 0, 4)
  with pytest.raises(ValueError, match="only an empty slot"):
    tables.fork(0, 1, 4)
  with pytest.raises(ValueError, match="0..8"):
    tables.fork(0, 2, 9)


def test_attach_retains_shared_pages_and_needs_an_empty_slot():
  allocator, tables = _tables()
  tables.reserve(0, 8)  # pages 1, 2
  tables.attach(1, [1, 2])
  assert tables.pages(1) == (1, 2)
  assert [allocator.refcount(p) for p in (1, 2)] == [2, 2]
  assert tables.reserve(1, 9) is None
  assert tables.pages(1) == (1, 2, 3)
  with pytest.raises(ValueError, match="only an empty slot"):
    tables.attach(1, [1])
  with pytest.raises(ValueError, match="is free"):
    tables.attach(2, [1, 5])
  with pytest.raises(ValueError, match="repeat"):
    tables.attach(2, [1, 1])
  with pytest.raises(ValueError, match="reserved"):
    tables.attach(2, [0])
  with pytest.raises(ValueError, match="max_pages"):
    tables.attach(2, [1, 2, 3, 4, 5])
  assert tables.is_empty(2)
  assert allocator.refcount(1) == 2
  tables.check()


def test_free_releases_every_page_and_empty_free_is_a_no_op():
  allocator, tables = _tables()
  tables.reserve(0, 9)
  tables.free(0)
  tables.free(0)
  assert tables.is_empty(0)
  assert not tables.table.any()
  assert allocator.num_free == 7


def test_check_counts_other_holders_and_catches_tampering():
  allocator, tables = _tables()
  tables.reserve(0, 4)  # page 1
  allocator.retain([1])  # an external holder
  tables.check()
  tables._table[0, 1] = 5  # pylint: disable=protected-access
  with pytest.raises(AssertionError, match="past its 1 pages"):
    tables.check()
  tables._table[0, 1] = 0  # pylint: disable=protected-access
  tables._table[0, 0] = 2  # pylint: disable=protected-access
  with pytest.raises(AssertionError, match="slot references"):
    tables.check()


# --- The property test -----------------------------------------------------

PAGE_SIZE = 4
NUM_PAGES = 12  # 11 usable: fewer than the slots can ask for
MAX_SLOTS = 4
MAX_PAGES = 5
MAX_TOKENS = MAX_PAGES * PAGE_SIZE
# Prompts are a prefix of one of a few shared documents plus a short random
# tail, so that prefix hits (and near misses) are common.
_DOCUMENTS = tuple(
    [int(t) for t in np.random.default_rng(seed).integers(0, 3, MAX_TOKENS)]
    for seed in range(3))
TOKENS = st.builds(
    lambda doc, n, tail: (_DOCUMENTS[doc][:n] + tail)[:MAX_TOKENS] or [0],
    st.integers(0, len(_DOCUMENTS) - 1), st.integers(0, MAX_TOKENS),
    st.lists(st.integers(0, 2), max_size=6))
SLOTS = st.integers(0, MAX_SLOTS - 1)


class PagedCacheMachine(stateful.RuleBasedStateMachine):
  """A scheduler's use of BlockTables + PrefixIndex against a simulated
  page pool `device`: page -> its PAGE_SIZE token positions."""

  @stateful.initialize(capacity=st.one_of(st.none(), st.integers(1, 8)))
  def setup(self, capacity):
    self.allocator = PageAllocator(NUM_PAGES)
    self.tables = BlockTables(self.allocator, MAX_SLOTS, MAX_PAGES,
                              PAGE_SIZE)
    self.index = PrefixIndex(self.allocator, PAGE_SIZE, capacity)
    self.tokens = {}  # slot -> the tokens it holds; absent when empty
    self.device = collections.defaultdict(lambda: [None] * PAGE_SIZE)

  # The state an OutOfPages must leave unchanged.
  def _snapshot(self):
    return (self.tables.table.tobytes(), self.allocator.free_pages,
            tuple(self.allocator.refcount(p) for p in range(NUM_PAGES)),
            self.index.cached_pages)

  def _write(self, slot, start, new_tokens):
    """Writes tokens at positions start.. of the slot, as the device
    would, after checking the slot holds each written page alone."""
    pages = self.tables.pages(slot)
    for i, token in enumerate(new_tokens, start):
      page = pages[i // PAGE_SIZE]
      assert self.allocator.refcount(page) == 1, (
          f"slot {slot} writes into page {page}, refcount "
          f"{self.allocator.refcount(page)}")
      self.device[page][i % PAGE_SIZE] = token
    self.tokens[slot] = self.tokens.get(slot, []) + list(new_tokens)

  def _reserve(self, slot, num_tokens):
    before = self._snapshot()
    result = self.tables.reserve(slot, num_tokens)
    if isinstance(result, OutOfPages):
      assert self._snapshot() == before
      assert result.free == self.allocator.num_free < result.needed
      return False
    assert result is None
    assert self.tables.num_tokens_capacity(slot) >= num_tokens
    return True

  @stateful.rule(slot=SLOTS, prompt=TOKENS, use_prefix=st.booleans(),
                 register=st.booleans())
  def admit(self, slot, prompt, use_prefix, register):
    if not self.tables.is_empty(slot):
      return
    cached = 0
    if use_prefix:
      # Leave at least one token to compute, as an engine must.
      hit = self.index.lookup(prompt[:-1])
      for j, page in enumerate(hit):
        assert self.device[page] == prompt[j * PAGE_SIZE:(j + 1) * PAGE_SIZE]
      self.tables.attach(slot, hit)
      cached = len(hit) * PAGE_SIZE
      self.tokens[slot] = prompt[:cached]
    if not self._reserve(slot, len(prompt)):
      self.tables.free(slot)
      self.tokens.pop(slot, None)
      return
    self._write(slot, cached, prompt[cached:])
    if register:  # as an engine caching prefixes does after a prefill
      self.insert(slot)

  @stateful.rule(slot=SLOTS, new=TOKENS)
  def grow(self, slot, new):
    if slot not in self.tokens:
      return
    start = len(self.tokens[slot])
    new = new[:MAX_TOKENS - start]
    if new and self._reserve(slot, start + len(new)):
      self._write(slot, start, new)

  @stateful.rule(src=SLOTS, dst=SLOTS, data=st.data())
  def fork(self, src, dst, data):
    if src == dst or src not in self.tokens or not self.tables.is_empty(dst):
      return
    num_tokens = data.draw(st.integers(0, len(self.tokens[src])))
    before = self._snapshot()
    result = self.tables.fork(src, dst, num_tokens)
    if isinstance(result, OutOfPages):
      assert self._snapshot() == before
      assert result == OutOfPages(needed=1, free=0)
      return
    full, partial = divmod(num_tokens, PAGE_SIZE)
    src_pages, dst_pages = self.tables.pages(src), self.tables.pages(dst)
    assert dst_pages[:full] == src_pages[:full]
    assert len(dst_pages) == full + (partial > 0)
    assert result == ([(src_pages[full], dst_pages[full])] if partial else [])
    for src_page, dst_page in result:
      self.device[dst_page] = list(self.device[src_page])
    if num_tokens:
      self.tokens[dst] = self.tokens[src][:num_tokens]
    else:
      assert self.tables.is_empty(dst)

  @stateful.rule(slot=SLOTS)
  def free(self, slot):
    self.tables.free(slot)
    self.tokens.pop(slot, None)

  @stateful.rule(slot=SLOTS)
  def insert(self, slot):
    if slot in self.tokens:
      self.index.insert(self.tokens[slot], self.tables.pages(slot))
      capacity = self.index.capacity_pages
      if capacity is not None and len(self.index) > capacity:
        assert self.index.num_evictable == 0

  @stateful.rule(num_pages=st.integers(0, 3))
  def evict(self, num_pages):
    refcounts = {p: self.allocator.refcount(p)
                 for p in self.index.cached_pages}
    free_before = self.allocator.num_free
    evictable = self.index.num_evictable
    freed = self.index.evict(num_pages)
    assert freed == min(num_pages, evictable)
    gone = set(refcounts) - set(self.index.cached_pages)
    assert len(gone) == freed
    assert all(refcounts[p] == 1 for p in gone)
    assert all(self.allocator.refcount(p) == 0 for p in gone)
    assert self.allocator.num_free == free_before + freed

  @stateful.rule(roll=st.integers(0, 9))
  def drain_sometimes(self, roll):
    if roll == 0:  # rarely, or the index would be empty most of the time
      self.drain()

  def drain(self):
    for slot in range(MAX_SLOTS):
      self.free(slot)
    self.index.evict(NUM_PAGES)
    assert len(self.index) == 0
    assert self.allocator.num_free == NUM_PAGES - 1
    assert self.allocator.num_used == 0

  @stateful.invariant()
  def consistent(self):
    self.tables.check()
    self.index.check()
    # Refcounts from this model alone: slot references plus the index's.
    expected = collections.Counter(self.index.cached_pages)
    for slot in range(MAX_SLOTS):
      pages = self.tables.pages(slot)
      assert 0 not in pages
      assert (slot in self.tokens) == bool(pages)
      expected.update(pages)
    for page in range(NUM_PAGES):
      assert self.allocator.refcount(page) == expected[page], page
    assert self.allocator.num_free == NUM_PAGES - 1 - len(expected)
    assert 0 not in self.allocator.free_pages
    # Every slot reads back its own tokens through its block-table row.
    table = self.tables.table
    for slot, tokens in self.tokens.items():
      assert len(tokens) <= self.tables.num_tokens_capacity(slot)
      read = [self.device[int(table[slot, i // PAGE_SIZE])][i % PAGE_SIZE]
              for i in range(len(tokens))]
      assert read == tokens, slot

  def teardown(self):
    if hasattr(self, "tables"):
      self.drain()


TestPagedCache = PagedCacheMachine.TestCase
TestPagedCache.settings = hypothesis.settings(
    max_examples=200, stateful_step_count=30, deadline=None)
