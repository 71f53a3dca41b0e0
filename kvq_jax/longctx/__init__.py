"""Long-context measurements of KV-cache quantization."""
