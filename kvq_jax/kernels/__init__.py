"""Decode-attention kernels over the (packed) KV cache, and their dispatch."""
