"""The papers' studies and the baseline comparison as commands (``rescale analyze``,
``rescale study``, ``rescale compare``): tables (CSV and markdown) and plots (PNG), logged to
W&B when a run is given."""
