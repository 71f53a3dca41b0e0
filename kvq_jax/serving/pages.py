"""Host side of a paged KV cache: a refcounted page allocator and the block
tables that map each slot's logical pages to pool pages (vLLM style).

The device holds, per layer, a pool of `num_pages` pages of `page_size`
tokens each. A block table, int32 [max_slots, max_pages], maps logical page
j of slot s to a pool page. Everything here is bookkeeping in plain Python
and numpy; the device only ever sees `BlockTables.table` and the copy pairs
`BlockTables.fork` returns.

Page 0 is reserved as the null / scratch page: it is never handed out, and
every unused block-table entry is 0, so a gather through an unused entry
reads page 0 and a masked write may land there harmlessly.

Sharing is by reference count. A page is free at refcount 0 and returns to
the free list when its last reference is released. Allocation is
deterministic, lowest free page first, so two runs of the same schedule use
the same pages. Running out of pages is an explicit `OutOfPages` result,
never an exception and never a silent overwrite, and a request that does not
fit changes nothing (all-or-nothing).

Who holds a reference is tracked too: every allocate / retain / release
names a `Holder` (by default `EXTERNAL`), and the allocator keeps, per
holder, how many references it has to each page. A page's refcount is the
sum over its holders. `BlockTables` holds its references under a holder of
its own and `PrefixIndex` (prefix_index.py) under another, so
`BlockTables.check` can verify that every refcount equals the references of
its slots plus those of the other holders, and a release by a holder that
holds no reference to the page (a double free) is a ValueError even while
someone else still holds the page.

Shared pages are read-only by convention: `fork` shares only the pages that
are full up to the fork point and copies a partial last page into a fresh
one, and prefix reuse (`attach`) shares only full pages, so a slot only ever
writes into pages it holds alone.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import operator
from typing import Iterable, Sequence

import numpy as np

# The reserved null / scratch page: never allocated, the value of every
# unused block-table entry.
NULL_PAGE = 0


@dataclasses.dataclass(frozen=True)
class OutOfPages:
  """A request for more pages than are free; nothing was changed."""

  needed: int  # pages the request asked for
  free: int  # pages free at the time


@dataclasses.dataclass(frozen=True, eq=False)
class Holder:
  """A named holder of page references, compared by identity: two holders
  with the same name are still two holders."""

  name: str

  def __repr__(self) -> str:
    return f"Holder({self.name!r})"


# The holder of references taken without naming one.
EXTERNAL = Holder("external")


def _as_int(value, name: str, where: str) -> int:
  """`value` as an int (numpy integers allowed); ValueError otherwise."""
  if isinstance(value, bool):
    raise ValueError(f"{where}: {name}={value!r} must be an integer, not a "
                     f"bool.")
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(f"{where}: {name}={value!r} must be an integer.") from None


def _as_pages(pages: Iterable[int], where: str) -> list[int]:
  return [_as_int(p, "page", where) for p in pages]


class PageAllocator:
  """Refcounted pages 1..num_pages-1 of a pool of `num_pages` (page 0 is
  reserved), handed out lowest free page first."""

  def __init__(self, num_pages: int):
    num_pages = _as_int(num_pages, "num_pages", "PageAllocator")
    if num_pages < 2:
      raise ValueError(
          f"PageAllocator: num_pages={num_pages}: must be at least 2 (page 0 "
          f"is reserved as the null page, so one page is never handed out).")
    self._num_pages = num_pages
    self._refcount = [0] * num_pages
    self._free = list(range(1, num_pages))  # a min-heap; sorted is a heap
    self._held: dict[Holder, collections.Counter] = {}

  @property
  def num_pages(self) -> int:
    """Pages in the pool, the reserved page 0 included."""
    return self._num_pages

  @property
  def num_free(self) -> int:
    return len(self._free)

  @property
  def num_used(self) -> int:
    """Pages with a nonzero refcount (never counts page 0)."""
    return self._num_pages - 1 - len(self._free)

  @property
  def free_pages(self) -> tuple[int, ...]:
    """The free pages, ascending (the order they would be allocated)."""
    return tuple(sorted(self._free))

  def refcount(self, page: int) -> int:
    """The page's reference count; 0 for a free page and for page 0."""
    page = _as_int(page, "page", "PageAllocator.refcount")
    self._check_range(page, "PageAllocator.refcount", allow_null=True)
    return self._refcount[page]

  def holdings(self, holder: Holder = EXTERNAL) -> collections.Counter:
    """page -> references `holder` holds to it (a copy; pages held at 0 are
    absent)."""
    return collections.Counter(self._held.get(holder, ()))

  def holders(self) -> tuple[Holder, ...]:
    """Every holder that holds at least one reference now."""
    return tuple(h for h, held in self._held.items() if held)

  def allocate(self, n: int,
               holder: Holder = EXTERNAL) -> list[int] | OutOfPages:
    """`n` fresh pages at refcount 1, held by `holder`, lowest first; or
    OutOfPages (and no change) if fewer than `n` are free. n == 0 -> []."""
    n = _as_int(n, "n", "PageAllocator.allocate")
    if n < 0:
      raise ValueError(f"PageAllocator.allocate: n={n}: must be >= 0.")
    self._check_holder(holder, "PageAllocator.allocate")
    if n > len(self._free):
      return OutOfPages(needed=n, free=len(self._free))
    pages = [heapq.heappop(self._free) for _ in range(n)]
    held = self._held.setdefault(holder, collections.Counter())
    for page in pages:
      self._refcount[page] = 1
      held[page] += 1
    return pages

  def retain(self, pages: Iterable[int], holder: Holder = EXTERNAL) -> None:
    """One more reference, held by `holder`, to each page (a page listed
    twice gains two). ValueError, changing nothing, if any page is free,
    reserved or out of range."""
    where = "PageAllocator.retain"
    pages = _as_pages(pages, where)
    self._check_holder(holder, where)
    for page in pages:
      self._check_range(page, where)
      if self._refcount[page] == 0:
        raise ValueError(
            f"{where}: page {page} is free; only an allocated page can be "
            f"retained (allocate it first).")
    held = self._held.setdefault(holder, collections.Counter())
    for page in pages:
      self._refcount[page] += 1
      held[page] += 1

  def release(self, pages: Iterable[int], holder: Holder = EXTERNAL) -> None:
    """Drops one of `holder`'s references to each page; a page at refcount 0
    returns to the free list. ValueError, changing nothing, if `holder` does
    not hold as many references as are released (a double free)."""
    where = "PageAllocator.release"
    pages = _as_pages(pages, where)
    self._check_holder(holder, where)
    held = self._held.get(holder, collections.Counter())
    wanted = collections.Counter()
    for page in pages:
      self._check_range(page, where)
      wanted[page] += 1
      if wanted[page] > held[page]:
        if self._refcount[page] == 0:
          raise ValueError(f"{where}: page {page} is already free (double "
                           f"free).")
        raise ValueError(
            f"{where}: {holder!r} holds {held[page]} reference(s) to page "
            f"{page} but releases {wanted[page]} (double free; the page's "
            f"refcount is {self._refcount[page]}).")
    for page in pages:
      held[page] -= 1
      if not held[page]:
        del held[page]
      self._refcount[page] -= 1
      if self._refcount[page] == 0:
        heapq.heappush(self._free, page)

  def check(self) -> None:
    """AssertionError unless every refcount is the sum of its holders'
    references, the free list is exactly the unreferenced pages 1.., and
    page 0 is never held."""
    counted = collections.Counter()
    for holder, held in self._held.items():
      for page, n in held.items():
        assert n > 0, f"{holder!r} holds {n} references to page {page}"
        assert page != NULL_PAGE, f"{holder!r} holds the reserved page 0"
        counted[page] += n
    for page in range(self._num_pages):
      assert self._refcount[page] == counted[page], (
          f"page {page}: refcount {self._refcount[page]} but its holders "
          f"hold {counted[page]} references")
    assert len(set(self._free)) == len(self._free), (
        f"the free list holds a page twice: {sorted(self._free)}")
    unreferenced = {p for p in range(1, self._num_pages)
                    if self._refcount[p] == 0}
    assert set(self._free) == unreferenced, (
        f"free list {sorted(self._free)} != unreferenced pages "
        f"{sorted(unreferenced)}")

  def _check_range(self, page: int, where: str, allow_null=False) -> None:
    if page == NULL_PAGE and not allow_null:
      raise ValueError(f"{where}: page 0 is reserved as the null page; "
                       f"allowed are pages 1..{self._num_pages - 1}.")
    if not 0 <= page < self._num_pages:
      raise ValueError(f"{where}: page {page} is out of range; allowed are "
                       f"pages 1..{self._num_pages - 1}.")

  @staticmethod
  def _check_holder(holder, where: str) -> None:
    if not isinstance(holder, Holder):
      raise ValueError(f"{where}: holder={holder!r} must be a Holder.")


class PageUser:
  """Holds references in a `PageAllocator` under a `Holder` of its own, for
  pages of `page_size` tokens: the part `BlockTables` and
  `prefix_index.PrefixIndex` share."""

  def __init__(self, allocator: PageAllocator, page_size: int, where: str):
    if not isinstance(allocator, PageAllocator):
      raise ValueError(f"{where}: allocator={allocator!r} must be a "
                       f"PageAllocator.")
    page_size = _as_int(page_size, "page_size", where)
    if page_size <= 0:
      raise ValueError(f"{where}: page_size={page_size}: must be positive.")
    self._allocator = allocator
    self._page_size = page_size
    self._holder = Holder(where)

  @property
  def allocator(self) -> PageAllocator:
    return self._allocator

  @property
  def holder(self) -> Holder:
    """The holder this object's references are held under."""
    return self._holder

  @property
  def page_size(self) -> int:
    return self._page_size


class BlockTables(PageUser):
  """Per-slot page lists for `max_slots` slots of up to `max_pages` pages of
  `page_size` tokens, kept as an int32 [max_slots, max_pages] block table.

  A slot is empty (no pages) or owns a run of pages in logical order; its
  references are held in `allocator` under this object's own holder. Every
  entry past a slot's pages is 0.
  """

  def __init__(self, allocator: PageAllocator, max_slots: int,
               max_pages: int, page_size: int):
    where = "BlockTables"
    super().__init__(allocator, page_size, where)
    for name, value in (("max_slots", max_slots), ("max_pages", max_pages)):
      if _as_int(value, name, where) <= 0:
        raise ValueError(f"{where}: {name}={value}: must be positive.")
    self._max_slots = operator.index(max_slots)
    self._max_pages = operator.index(max_pages)
    self._table = np.zeros((self._max_slots, self._max_pages), np.int32)
    self._length = [0] * self._max_slots  # pages owned per slot

  @property
  def max_slots(self) -> int:
    return self._max_slots

  @property
  def max_pages(self) -> int:
    return self._max_pages

  @property
  def max_tokens(self) -> int:
    """The most tokens one slot can hold: max_pages * page_size."""
    return self._max_pages * self._page_size

  @property
  def table(self) -> np.ndarray:
    """int32 [max_slots, max_pages], a copy; unused entries are 0."""
    return self._table.copy()

  def pages(self, slot: int) -> tuple[int, ...]:
    """The slot's pages in logical order (empty for an empty slot)."""
    slot = self._slot(slot, "BlockTables.pages")
    return tuple(int(p) for p in self._table[slot, :self._length[slot]])

  def num_tokens_capacity(self, slot: int) -> int:
    """Tokens the slot's pages can hold: len(pages) * page_size."""
    slot = self._slot(slot, "BlockTables.num_tokens_capacity")
    return self._length[slot] * self._page_size

  def is_empty(self, slot: int) -> bool:
    return self._length[self._slot(slot, "BlockTables.is_empty")] == 0

  def reserve(self, slot: int, num_tokens: int) -> None | OutOfPages:
    """Grows the slot's pages to cover `num_tokens` tokens in all (never
    shrinks). OutOfPages, changing nothing, if the new pages are not free;
    ValueError past max_tokens."""
    where = "BlockTables.reserve"
    slot = self._slot(slot, where)
    num_tokens = self._num_tokens(num_tokens, self.max_tokens, where)
    needed = -(-num_tokens // self._page_size) - self._length[slot]
    if needed <= 0:
      return None
    fresh = self._allocator.allocate(needed, self._holder)
    if isinstance(fresh, OutOfPages):
      return fresh
    start = self._length[slot]
    self._table[slot, start:start + needed] = fresh
    self._length[slot] = start + needed
    return None

  def attach(self, slot: int, pages: Sequence[int]) -> None:
    """An empty slot starts with `pages` (shared full pages, e.g. a prefix
    cache hit), retaining each. ValueError, changing nothing, for a
    non-empty slot, too many or repeated pages, or a free / reserved page."""
    where = "BlockTables.attach"
    slot = self._slot(slot, where)
    pages = _as_pages(pages, where)
    if self._length[slot]:
      raise ValueError(f"{where}: slot {slot} holds {self._length[slot]} "
                       f"page(s); only an empty slot can be attached to "
                       f"(free it first).")
    if len(pages) > self._max_pages:
      raise ValueError(f"{where}: {len(pages)} pages do not fit a slot of "
                       f"max_pages={self._max_pages}.")
    if len(set(pages)) != len(pages):
      raise ValueError(f"{where}: pages {pages} repeat a page; a slot holds "
                       f"each page at most once.")
    self._allocator.retain(pages, self._holder)  # validates before changing
    self._table[slot, :len(pages)] = pages
    self._length[slot] = len(pages)

  def fork(self, src: int, dst: int,
           num_tokens: int) -> list[tuple[int, int]] | OutOfPages:
    """The empty slot `dst` starts as a copy of the first `num_tokens`
    tokens of `src`: it shares (retains) src's pages that are full up to
    there, and a partial last page is copied into a fresh page. Returns the
    (src_page, dst_page) pairs the device must copy (at most one), or
    OutOfPages, changing nothing, if the fresh page is not free."""
    where = "BlockTables.fork"
    src = self._slot(src, where)
    dst = self._slot(dst, where)
    if src == dst:
      raise ValueError(f"{where}: src and dst are both slot {src}; a slot "
                       f"cannot be forked into itself.")
    if self._length[dst]:
      raise ValueError(f"{where}: dst slot {dst} holds {self._length[dst]} "
                       f"page(s); only an empty slot can be forked into.")
    num_tokens = self._num_tokens(num_tokens, self.num_tokens_capacity(src),
                                  where, f"slot {src}'s capacity")
    full, partial = divmod(num_tokens, self._page_size)
    shared = [int(p) for p in self._table[src, :full]]
    copies = []
    if partial:
      fresh = self._allocator.allocate(1, self._holder)
      if isinstance(fresh, OutOfPages):
        return fresh
      copies.append((int(self._table[src, full]), fresh[0]))
    self._allocator.retain(shared, self._holder)
    new = shared + [d for _, d in copies]
    self._table[dst, :len(new)] = new
    self._length[dst] = len(new)
    return copies

  def free(self, slot: int) -> None:
    """Releases every page of the slot; the slot becomes empty (freeing an
    empty slot does nothing)."""
    slot = self._slot(slot, "BlockTables.free")
    owned = [int(p) for p in self._table[slot, :self._length[slot]]]
    self._allocator.release(owned, self._holder)
    self._table[slot] = NULL_PAGE
    self._length[slot] = 0

  def check(self) -> None:
    """AssertionError unless the table and the allocator agree: each
    page's refcount equals its slot references plus the references of the
    allocator's other holders (e.g. a PrefixIndex), slots own only allocated
    pages, never page 0 and never one page twice, unused entries are 0, and
    the free list is disjoint from every used page."""
    self._allocator.check()
    slot_refs = collections.Counter()
    for slot in range(self._max_slots):
      n = self._length[slot]
      owned = [int(p) for p in self._table[slot, :n]]
      assert NULL_PAGE not in owned, f"slot {slot} owns page 0: {owned}"
      assert len(set(owned)) == n, f"slot {slot} owns a page twice: {owned}"
      assert not self._table[slot, n:].any(), (
          f"slot {slot} has nonzero entries past its {n} pages: "
          f"{self._table[slot].tolist()}")
      slot_refs.update(owned)
    assert self._allocator.holdings(self._holder) == slot_refs, (
        f"slot references {dict(slot_refs)} != the references held for the "
        f"slots {dict(self._allocator.holdings(self._holder))}")
    others = collections.Counter()
    for holder in self._allocator.holders():
      if holder is not self._holder:
        others.update(self._allocator.holdings(holder))
    for page in range(1, self._allocator.num_pages):
      expected = slot_refs[page] + others[page]
      assert self._allocator.refcount(page) == expected, (
          f"page {page}: refcount {self._allocator.refcount(page)} != "
          f"{slot_refs[page]} slot reference(s) + {others[page]} other")
    used = set(slot_refs) | set(others)
    free = set(self._allocator.free_pages)
    assert not used & free, f"pages both used and free: {sorted(used & free)}"

  def _slot(self, slot, where: str) -> int:
    slot = _as_int(slot, "slot", where)
    if not 0 <= slot < self._max_slots:
      raise ValueError(f"{where}: slot {slot} is out of range; allowed are "
                       f"0..{self._max_slots - 1}.")
    return slot

  @staticmethod
  def _num_tokens(num_tokens, limit: int, where: str,
                  limit_name: str = "max_pages * page_size") -> int:
    num_tokens = _as_int(num_tokens, "num_tokens", where)
    if not 0 <= num_tokens <= limit:
      raise ValueError(f"{where}: num_tokens={num_tokens}: allowed are "
                       f"0..{limit} ({limit_name}).")
    return num_tokens
