"""rescale_core: residual schemes, layers, model families and probes for normalization-free nets.

RescaleNet (Shao et al., NeurIPS 2020) and the schemes it is compared with: BatchNorm ResNets,
SkipInit (De & Smith 2020), Fixup (Zhang et al. 2019) and ReZero (Bachlechner et al. 2020).

    >>> import rescale_core
    >>> model = rescale_core.create_model("resnet101", scheme="rescale", num_classes=10)
    >>> groups = rescale_core.param_groups(model, weight_decay=1e-4, lr=0.1)

Nothing here imports Lightning, W&B or data code; every task builds its networks through
:func:`create_model`. :mod:`rescale_core.generation` translates with a Transformer (greedy
and beam search over cached keys/values); :func:`adaptive_clip_grad_` is Adaptive Gradient
Clipping (Brock et al. 2021) in a few launches (:mod:`rescale_core.agc`).
"""
import importlib.metadata
import re
from pathlib import Path

from . import agc, analysis, generation, models  # noqa: F401  (models registers every family)
from .agc import adaptive_clip_grad_
from .blocks import ResidualBlock, ResidualMerge, ResidualSublayer
from .generation import beam_search, greedy_search
from .layers import Gain, MeanShiftBias, ScalarBias
from .optim import param_groups
from .plans import PLANS, plan_of, reference_path, set_plan
from .plans import folded, frozen, lean  # noqa: F401  (each registers its plan for every module type)
from .registry import create_model, list_models, register_model
from .schemes import Scheme, get_scheme, list_schemes, register_scheme

__all__ = [
    "create_model", "list_models", "register_model", "list_schemes", "get_scheme", "register_scheme",
    "Scheme", "param_groups", "analysis", "ResidualBlock", "ResidualMerge", "ResidualSublayer",
    "MeanShiftBias", "ScalarBias", "Gain", "mean_shift_layers", "finish_measuring",
    "reference_path", "generation", "greedy_search", "beam_search", "PLANS", "set_plan", "plan_of",
    "agc", "adaptive_clip_grad_",
]


def _suite_version() -> str:
    """The installed distribution's version (pyproject.toml's ``version``); run from a checkout
    that is not installed, its pyproject.toml's; ``unknown`` when neither says."""
    try:
        return importlib.metadata.version("rescale-suite")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
        found = re.search(r'^name = "rescale-suite"\n(?:.*\n)*?version = "([^"]+)"', text, re.M)
        return found.group(1) if found else "unknown"


#: the suite's version (``rescale_tasks.__version__`` is the same)
__version__ = _suite_version()


def mean_shift_layers(model):
    """Every :class:`MeanShiftBias` of ``model``."""
    return [m for m in model.modules() if isinstance(m, MeanShiftBias)]


def finish_measuring(model) -> None:
    """Freeze every mean-shift statistic of ``model`` now."""
    for m in mean_shift_layers(model):
        m.finish_measuring()
