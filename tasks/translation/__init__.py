"""WMT translation with deep normalization-free Transformers."""
