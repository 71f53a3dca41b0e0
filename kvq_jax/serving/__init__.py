"""Serving: a paged quantized KV cache's host side (page allocator,
prefix cache) and the continuous-batching engine; what a device's memory
holds per cache kind (`capacity_plan`, experiments.capacity)."""
