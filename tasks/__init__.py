"""rescale_tasks: the tasks (classification, detection, translation, video), the studies and the
``rescale`` command, all built on :mod:`rescale_core`."""
import os

# TensorFlow, where it is installed beside TensorBoard, prints start-up noise unless this is set
# before it loads (Lightning may load it); every module of the package imports this file first.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def __getattr__(name: str) -> str:
    """``rescale_tasks.__version__``: the suite's version, ``rescale_core.__version__``."""
    if name == "__version__":
        from rescale_core import __version__  # when asked: importing the package alone loads no torch

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
