"""rescale_tasks: the tasks (classification, detection, translation, video), the studies and the
``rescale`` command, all built on :mod:`rescale_core`."""
import os

# TensorFlow, where it is installed beside TensorBoard, prints start-up noise unless this is set
# before it loads (Lightning may load it); every module of the package imports this file first.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
