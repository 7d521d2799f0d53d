"""WMT translation with deep normalization-free Transformers (issue #12)."""
