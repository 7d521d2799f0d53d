"""The basic-block recipe (docs/studies.md, the basic-block yardstick) is what the basic-block
RescaleNet configs carry, and every overlay of the yardstick's ablation builds the network it
names over the yardstick's base config."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rescale_tasks.common.cli import build_run

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"
BASIC_BLOCK_RESCALE = sorted([*EXPERIMENTS.glob("cifar/wrn*_rescale.yaml"),
                              EXPERIMENTS / "digits/rescale56.yaml", EXPERIMENTS / "mnist5k/resnet20_rescale.yaml"])
RECIPE = {"shortcut_gain": 2.0, "classifier_gain": 10.0}


def _scheme_options(*configs: Path) -> dict:
    args = []
    for config in configs:
        args += ["--config", str(config)]
    return build_run(args).config["model"]["init_args"]["scheme_options"] or {}


@pytest.mark.parametrize("config", BASIC_BLOCK_RESCALE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_basic_block_rescale_configs_carry_the_recipe(config):
    assert _scheme_options(config) == RECIPE


@pytest.mark.parametrize("base, recipe", [("cifar/wrn16-4_bn.yaml", "cifar/recipes/rescale.yaml"),
                                          ("digits/resnet56_bn.yaml", "digits/recipes/rescale.yaml"),
                                          ("mnist5k/resnet20_bn.yaml", "mnist5k/recipes/rescale.yaml")])
def test_the_recipes_given_by_rescale_study_carry_it(base, recipe):
    assert _scheme_options(EXPERIMENTS / base, EXPERIMENTS / recipe) == RECIPE


ABLATIONS = sorted((EXPERIMENTS / "mnist5k" / "ablations").glob("*.yaml"))


def test_each_ablation_overlay_builds_the_rescale_network_it_names():
    assert len(ABLATIONS) == 10
    seen = set()
    for overlay in ABLATIONS:
        cli = build_run(["--config", str(EXPERIMENTS / "mnist5k/resnet20_bn.yaml"), "--config", str(overlay)])
        scheme = cli.model.net.scheme
        assert scheme.name == "rescale"
        warmup = cli.config["model"]["init_args"]["lr_scheduler"]["init_args"]["warmup_epochs"]
        seen.add((scheme.shortcut_gain, scheme.classifier_gain, scheme.c, scheme.mean_shift, scheme.gain,
                  scheme.scalar_lr_factor, warmup))
    assert len(seen) == len(ABLATIONS)  # no two overlays train the same thing


AGC_OVERLAYS = {"mnist5k/resnet20_bn.yaml": sorted((EXPERIMENTS / "mnist5k" / "agc").glob("*.yaml")),
                "digits/resnet56_bn.yaml": sorted((EXPERIMENTS / "digits" / "agc").glob("*.yaml"))}
AGC_NAME = re.compile(r"(?P<scheme>.+?)(?:_warmup1)?(?:_agc(?P<digits>\d*))?")


@pytest.mark.parametrize("base, count", [("mnist5k/resnet20_bn.yaml", 13), ("digits/resnet56_bn.yaml", 7)])
def test_each_agc_overlay_builds_the_scheme_it_names_with_agc_where_its_name_says(base, count):
    """The rows of the AGC studies (docs/studies.md): ``<scheme>[_warmup1][_agc[NN]].yaml`` after
    the base config (bn itself is the base): AGC exactly in the ``_agc`` rows, at the paper's lambda
    0.01, or at 0.NN where the name says (the lambda sweep)."""
    overlays = AGC_OVERLAYS[base]
    assert len(overlays) == count
    for overlay in overlays:
        cli = build_run(["--config", str(EXPERIMENTS / base), "--config", str(overlay)])
        name = AGC_NAME.fullmatch(overlay.stem)
        assert cli.model.net.scheme.name == name["scheme"], overlay.name
        clip = None if name["digits"] is None else float(f"0.{name['digits'] or '01'}")
        assert cli.model.hparams.agc_clip == clip, overlay.name


def test_the_demo_trains_rescale_at_the_recipe_its_digits_config_carries():
    from rescale_tasks.classification.demo import SCHEME_OPTIONS

    assert SCHEME_OPTIONS == {"rescale": _scheme_options(EXPERIMENTS / "digits/rescale56.yaml")}
