"""The papers' studies and the baseline comparison as commands (``rescale analyze``,
``rescale study``, ``rescale compare``): tables (CSV and markdown) and plots (PNG), logged to
W&B when a run is given.

* :mod:`.analyze`, :mod:`.models`: ``rescale analyze``, probing models built as training builds them.
* :mod:`.study`: ``rescale study``; its grids (:mod:`.points`, :mod:`.grid`), the engines that run
  them (:mod:`.engines` here, :mod:`.cluster` for SLURM and W&B sweeps), and what the points ended
  with, as rows (:mod:`.results`), tables (:mod:`.tables`, :mod:`.seeded`) and plots
  (:mod:`.plots`), written by :mod:`.aggregate`;
  :mod:`.readme_tables` copies published tables into a document.
* :mod:`.compare`: ``rescale compare``.
* :mod:`.outputs`: the CSV, markdown, PNG and W&B outputs every command writes.
"""
