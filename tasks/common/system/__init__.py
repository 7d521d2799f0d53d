"""Process and file plumbing every command stands on: host memory, CPU cores, files written whole,
one process per folder, writable output folders, the signals that stop a run, and the decisions all
processes of a distributed run take together.

- ``allocator``: keep the memory the C allocator frees, so a CPU step reuses its pages
- ``cores``: the CPU cores this process may use, and the DataLoader workers started on them
- ``atomic``: result files written whole or not at all
- ``provenance``: which code made a result (the suite's version, the git commit of a checkout)
- ``lock``: one process at a time in a folder (an ``flock`` the system releases)
- ``writable``: output folders checked before a command starts its work
- ``stop_signals``: the signals that stop a run, and what each process does with them
- ``distributed``: decisions every process of a run takes together (host-integer votes, gathers)
- ``logs``: the suite's messages through one ``logging`` hierarchy, configured by the command only
- ``devices``: the ``--device`` a command is given, checked before its work
"""
from .allocator import ENV, host_allocator, keep_freed_memory
from .cores import loader_workers, usable_cores
from .atomic import atomic_open, atomic_path, write_atomically
from .provenance import CODE_KEY, CodeVersion, code_version, describe_code
from .lock import LOCK_FILE, FolderBusy, folder_lock, lock_holder, writer_folder
from .writable import FULL_DISK, require_writable, write_failure
from .stop_signals import POLITE_SIGNALS, STOP_SIGNALS, drop_gone_terminal, ignore_in_worker, signal_label
from .logs import (LEVEL_ENV, StdStreams, command_logging, library_levels, log_level, output_closed,
                   quiet_dependency_warnings, rank_zero_log, write_output)

__all__ = ["ENV", "host_allocator", "keep_freed_memory", "loader_workers", "usable_cores", "atomic_open",
           "atomic_path", "write_atomically", "CODE_KEY", "CodeVersion", "code_version", "describe_code",
           "LOCK_FILE", "FolderBusy", "folder_lock", "lock_holder", "writer_folder", "require_writable", "write_failure", "FULL_DISK", "POLITE_SIGNALS",
           "STOP_SIGNALS", "drop_gone_terminal", "ignore_in_worker", "signal_label",
           "broadcast_from_rank_zero", "every_rank_has_samples", "gather_by_key", "gather_objects",
           "max_over_ranks", "rank", "reduce_tensor_to_rank_zero", "sum_over_ranks", "sum_tensor_over_ranks",
           "world_size", "zero_loss", "LEVEL_ENV", "StdStreams", "command_logging", "library_levels", "log_level",
           "rank_zero_log", "write_output", "output_closed", "quiet_dependency_warnings", "resolve_device"]

# torch's: imported with the first of these names a caller asks for (``rescale --version`` and
# ``rescale --help`` use this package and load no torch)
_DISTRIBUTED = ("broadcast_from_rank_zero", "every_rank_has_samples", "gather_by_key", "gather_objects",
                "max_over_ranks", "rank", "reduce_tensor_to_rank_zero", "sum_over_ranks", "sum_tensor_over_ranks",
                "world_size", "zero_loss")


def __getattr__(name: str):
    if name in _DISTRIBUTED:
        from . import distributed  # torch, when a name of it is first asked for (above)

        return getattr(distributed, name)
    if name == "resolve_device":
        from .devices import resolve_device  # torch, when it is first asked for (above)

        return resolve_device
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
