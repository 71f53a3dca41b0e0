"""Serving: a paged quantized KV cache's host side (page allocator,
prefix cache) and the continuous-batching engine."""
