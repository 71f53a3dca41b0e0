"""Host side of a prefix cache: full KV pages kept, by the tokens that
produced them, for reuse by later requests with the same prefix.

A full page's key is a chained hash of every token up to that page's end:
key_j = sha256(key_{j-1} || tokens of page j as little-endian int32 bytes),
with key_{-1} = b"". Keys are independent entries (evicting page j does not
drop the keys after it), but a lookup walks the chain from page 0 and stops
at the first key it does not hold, so only a run of leading pages is ever
reused. Only full pages get keys: a partial last page is still being
written, and a shared page must never be written again.

The index holds one reference to every page it registers, in the page
allocator under its own `Holder`, so `BlockTables.check` counts those
references with the slots' and a slot freeing its pages leaves the cached
ones alive. A cached page whose only reference is the index's (refcount 1)
is evictable; one that a slot still uses is never evicted.

Eviction is least recently used first. A lookup or insert marks the pages
of the chain it touched as recently used from the last page back to page 0,
so of one chain the tail goes first and a chain's head, which every longer
match needs, goes last.

`capacity_pages`, if given, bounds the pages the index holds: after an
insert it evicts down to the bound, as far as evictable pages allow (pages
still used by slots stay, so the bound may be exceeded while they are).
"""

from __future__ import annotations

import collections
import hashlib
from typing import Sequence

import numpy as np

from kvq_jax.serving.pages import (PageAllocator, PageUser, _as_int,
                                   _as_pages)

_INT32 = np.iinfo(np.int32)


def _tokens_array(tokens: Sequence[int], where: str) -> np.ndarray:
  """`tokens` as a 1-D little-endian int32 array; ValueError if they are not
  integers within int32."""
  array = np.asarray(tokens)
  if array.size == 0:
    return np.zeros((0,), "<i4")
  if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
    raise ValueError(f"{where}: tokens must be a 1-D sequence of integers, "
                     f"got shape {array.shape} of {array.dtype}.")
  if array.min() < _INT32.min or array.max() > _INT32.max:
    raise ValueError(f"{where}: tokens must fit int32, got values in "
                     f"[{array.min()}, {array.max()}].")
  return array.astype("<i4")


def page_keys(tokens: Sequence[int], page_size: int) -> list[bytes]:
  """The chained sha256 key of each full page of `tokens` (a partial last
  page gets none): equal prefixes give equal keys, and a change in page j
  changes the key of page j and of every page after it."""
  page_size = _as_int(page_size, "page_size", "page_keys")
  if page_size <= 0:
    raise ValueError(f"page_keys: page_size={page_size}: must be positive.")
  array = _tokens_array(tokens, "page_keys")
  keys, key = [], b""
  for j in range(len(array) // page_size):
    page = array[j * page_size:(j + 1) * page_size]
    key = hashlib.sha256(key + page.tobytes()).digest()
    keys.append(key)
  return keys


class PrefixIndex(PageUser):
  """Cached full pages by chained prefix key, holding one allocator
  reference to each, evicted least recently used first."""

  def __init__(self, allocator: PageAllocator, page_size: int,
               capacity_pages: int | None = None):
    where = "PrefixIndex"
    super().__init__(allocator, page_size, where)
    if capacity_pages is not None:
      capacity_pages = _as_int(capacity_pages, "capacity_pages", where)
      if capacity_pages < 0:
        raise ValueError(f"{where}: capacity_pages={capacity_pages}: must be "
                         f">= 0 or None (unbounded).")
    self._capacity = capacity_pages
    # key -> page, least recently used first.
    self._entries: collections.OrderedDict[bytes, int] = (
        collections.OrderedDict())
    self._key_of: dict[int, bytes] = {}  # page -> its key

  @property
  def capacity_pages(self) -> int | None:
    return self._capacity

  @property
  def cached_pages(self) -> tuple[int, ...]:
    """The pages the index holds, least recently used first."""
    return tuple(self._entries.values())

  @property
  def num_evictable(self) -> int:
    """Cached pages only the index holds: what `evict` could free now."""
    return sum(self._allocator.refcount(p) == 1
               for p in self._entries.values())

  def __len__(self) -> int:
    return len(self._entries)

  def lookup(self, tokens: Sequence[int]) -> list[int]:
    """The cached pages of the longest run of `tokens`' leading full pages
    the index holds, in order; marks them recently used. Takes no
    reference: attach them to a slot (which retains) before any evict."""
    pages = []
    keys = page_keys(tokens, self._page_size)
    for key in keys:
      page = self._entries.get(key)
      if page is None:
        break
      pages.append(page)
    self._touch(keys[:len(pages)])
    return pages

  def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> None:
    """Registers `pages[j]` under the key of `tokens`' full page j, for
    every full page (pages past them, e.g. a partial last page, are
    ignored), retaining each newly registered page for the index. A key
    already held is left as is. ValueError, changing nothing, if there are
    fewer pages than full pages, or a page is free, reserved, repeated or
    already cached under another key."""
    where = "PrefixIndex.insert"
    keys = page_keys(tokens, self._page_size)
    pages = _as_pages(pages, where)
    if len(pages) < len(keys):
      raise ValueError(f"{where}: {len(keys)} full page(s) of tokens but only "
                       f"{len(pages)} page(s).")
    new = {}  # key -> page, for the keys not held yet
    for key, page in zip(keys, pages):
      if key in self._entries or key in new:
        continue
      if page in self._key_of or page in new.values():
        raise ValueError(
            f"{where}: page {page} is already cached under another prefix; "
            f"a page holds one prefix's tokens.")
      if not 0 < page < self._allocator.num_pages or (
          self._allocator.refcount(page) == 0):
        raise ValueError(
            f"{where}: page {page} is not an allocated page (page 0 is "
            f"reserved); only pages a slot holds can be cached.")
      new[key] = page
    self._allocator.retain(list(new.values()), self._holder)
    for key, page in new.items():
      self._entries[key] = page
      self._key_of[page] = key
    self._touch(keys)
    if self._capacity is not None and len(self._entries) > self._capacity:
      self.evict(len(self._entries) - self._capacity)

  def evict(self, num_pages: int) -> int:
    """Frees up to `num_pages` cached pages that only the index holds,
    least recently used first (pages a slot still uses stay); returns how
    many were freed."""
    num_pages = _as_int(num_pages, "num_pages", "PrefixIndex.evict")
    if num_pages < 0:
      raise ValueError(f"PrefixIndex.evict: num_pages={num_pages}: must be "
                       f">= 0.")
    victims = []
    for key, page in self._entries.items():
      if len(victims) == num_pages:
        break
      if self._allocator.refcount(page) == 1:
        victims.append(key)
    pages = [self._entries.pop(key) for key in victims]
    for page in pages:
      del self._key_of[page]
    self._allocator.release(pages, self._holder)
    return len(pages)

  def check(self) -> None:
    """AssertionError unless the index holds exactly one allocator
    reference to each cached page and its two maps agree."""
    assert len(self._key_of) == len(self._entries), (
        f"{len(self._entries)} keys but {len(self._key_of)} pages")
    for key, page in self._entries.items():
      assert self._key_of.get(page) == key, (
          f"page {page}'s key does not map back to it")
    held = self._allocator.holdings(self._holder)
    expected = collections.Counter(self._entries.values())
    assert held == expected, (
        f"the index holds references {dict(held)} but caches "
        f"{dict(expected)}")

  def _touch(self, keys: Sequence[bytes]) -> None:
    """Marks the pages of `keys` (one chain, head first) recently used, the
    head most recently."""
    for key in reversed(keys):
      if key in self._entries:
        self._entries.move_to_end(key)
