"""Repository tools run from its root (``python -m tools.<name>``); not installed."""
