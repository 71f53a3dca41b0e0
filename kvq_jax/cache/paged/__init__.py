"""The paged cache: a page pool + block table under every format.

`layer.py`: `PagedLayerCache`, `QuantizedLayerCache`'s formats over a page
pool; `store.py`: the pool's leaves and the block table's gathers and
scatters; `model.py`: a whole model's paged cache and the per-slot
operations a server needs.
"""
