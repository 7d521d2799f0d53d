"""``rescale export``: a trained network written as a plain one (ONNX, ExportedProgram,
TorchScript) and checked against the PyTorch model on real inputs of its task.

- ``command``: ``rescale export``: the command, its files and their checks
- ``formats``: the three formats: each written, read back and run on real inputs
- ``programs``: what is exported for a task: modules called on real inputs
"""
from .command import ExportCheckFailed, export_paths
from .formats import (FORMATS, INSTALL_HINT, Format, capture, evaluating, max_difference, op_counts,
                      require_packages, tensors_of, varying_sizes)
from .programs import ExportProgram, any_size_only, batch_dynamic, export_programs

__all__ = ["ExportCheckFailed", "export_paths", "FORMATS", "INSTALL_HINT", "Format", "capture", "evaluating",
           "max_difference", "op_counts", "require_packages", "tensors_of", "varying_sizes", "ExportProgram",
           "any_size_only", "batch_dynamic", "export_programs"]
