"""What a run shows while it trains: its W&B logger, progress lines where the output is a file, and
the probes' figures.

- ``wandb_logger``: W&B logging that never hangs for lack of network
- ``progress``: one progress line every N steps where the output is a file
- ``figures``: figures drawn without a display, finished the same way everywhere
- ``probe_plots``: the probes' table rows and figures (signal propagation, learned multipliers)
- ``analysis_logger``: the probes' figures logged to W&B while a run trains
"""
from .wandb_logger import SuiteWandbLogger, current_run, discard_run, label_runs, started, wandb_mode
from .progress import CountProgress, LineProgress, interactive, use_line_progress
from .figures import finish_figure, new_figure
from .probe_plots import (SCALAR_COLUMNS, SIGNAL_COLUMNS, gain_rows, log_scale_if_positive, rows_by_run,
                          scalars_figure, signal_figure, signal_rows)
from .analysis_logger import AnalysisPlotsLogger

__all__ = ["SuiteWandbLogger", "current_run", "discard_run", "label_runs", "started", "wandb_mode", "CountProgress", "LineProgress",
           "interactive", "use_line_progress", "finish_figure", "new_figure", "SCALAR_COLUMNS", "SIGNAL_COLUMNS",
           "gain_rows", "log_scale_if_positive", "rows_by_run", "scalars_figure", "signal_figure", "signal_rows",
           "AnalysisPlotsLogger"]
