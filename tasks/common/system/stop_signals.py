"""The signals that ask a run to stop, and what each process of a run does with them.

A training run stops the way SIGTERM stops it (the current step finishes, ``last.ckpt`` is saved,
the run summary says where, the command exits with ``128 + signal`` and one line saying how to
resume; :class:`~..checkpoints.callbacks.LastCheckpoint`) on each of :data:`STOP_SIGNALS`:

- SIGTERM: cluster preemption, ``scancel``, ``kill`` (Lightning's own handler);
- SIGINT: Ctrl-C while training (a second Ctrl-C stops at once, without saving);
- SIGHUP: the terminal went away (a closed ssh session); output to a terminal that is gone is
  dropped from then on (:func:`drop_gone_terminal`) rather than failing the next write;
- SIGUSR1, SIGUSR2, SIGXCPU, SIGPWR: what job schedulers send ahead of a kill (``sbatch
  --signal=USR2@120``, a CPU-time limit; under SLURM SIGUSR1 is Lightning's requeue signal) and
  power daemons before a shutdown.

A signal the process ignores (``nohup``'s SIGHUP, a background job's SIGINT) or already handles
(Lightning's SLURM requeue on SIGUSR1) is left as it is. SIGQUIT (Ctrl-\\, asking for a core
dump) and the timer signals keep their meaning. Data-loader workers ignore every one of them
(:func:`ignore_in_worker`): the main process ends them once it has saved.
"""
from __future__ import annotations

import os
import signal

__all__ = ["STOP_SIGNALS", "POLITE_SIGNALS", "signal_label", "ignore_in_worker", "drop_gone_terminal"]

# besides SIGTERM and SIGINT, which have handlers of their own (Lightning's, Ctrl-C's)
POLITE_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGHUP", "SIGUSR1", "SIGUSR2", "SIGXCPU", "SIGPWR") if hasattr(signal, name))
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, *POLITE_SIGNALS)


def signal_label(signum: int) -> str:
    """``Ctrl-C (SIGINT)``, ``SIGHUP`` ...: how the suite's lines name a signal."""
    name = signal.Signals(signum).name
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name


def ignore_in_worker() -> None:
    """In a data-loader worker: leave every stop signal to the main process (a worker dying of one
    would crash the run before the main process finishes its step and saves)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def drop_gone_terminal() -> None:
    """Point stdout and stderr at ``/dev/null`` when they are a terminal that has hung up (every
    write to one fails with EIO, which would end the run in the middle of saving it)."""
    for fd in (1, 2):
        try:
            os.write(fd, b"")
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
