"""The public face: ``QSDPConfig`` (typed, presets as named constructors), ``QSDP(config)`` and one
``apply_qsdp(model, config)``; flat options build the same configuration as the typed one, and the removed
spellings fail naming the one spelling."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import Adapter, _train

from composer_qsdp import (QSDP, CodecOptions, DifferenceOptions, LearnedOptions, QSDPConfig, SideConfig,
                           TwoLevelOptions, apply_qsdp)
from composer_qsdp.config import preset_names
from composer_qsdp.quant import make_codec
from composer_qsdp.recipes.loader import RecipeError, load_recipe
from composer_qsdp.registry import CODECS, GRAD_SCHEMES, PRESETS, WEIGHT_SCHEMES
from composer_qsdp.schemes import build_codec

ROOT = Path(__file__).resolve().parents[2]

#: qWD weights with a Hadamard rotation and two-level gradients: every typed option class on the path.
FLAT_OPTIONS = dict(weight_scheme="difference", weight_codec="symmetric", weight_bits=4, weight_bucket_size=64,
                    weight_codec_options={"hadamard": True}, weight_scheme_options={"keyframe_every": 3},
                    grad_scheme="two_level", grad_codec="symmetric", grad_bits=4, grad_bucket_size=64,
                    grad_scheme_options={"intra_codec": {"name": "symmetric", "bits": 8, "bucket_size": 64},
                                         "rotation_block": 32},
                    seed=11)
TYPED_CONFIG = QSDPConfig(
    weights=SideConfig(bits=4, codec="symmetric", bucket_size=64, codec_options=CodecOptions(hadamard=True),
                       scheme="difference", scheme_options=DifferenceOptions(keyframe_every=3)),
    grads=SideConfig(bits=4, codec="symmetric", bucket_size=64, scheme="two_level",
                     scheme_options=TwoLevelOptions(intra_codec={"name": "symmetric", "bits": 8, "bucket_size": 64},
                                                    rotation_block=32)),
    seed=11,
)


def test_a_typo_names_the_allowed_options_and_the_closest():
    with pytest.raises(ValueError, match=r"unknown QSDP option 'weight_bit'; did you mean 'weight_bits'\?; "
                                         r"allowed: weight_bits, weight_codec, "):
        QSDPConfig.from_preset("w8g4", weight_bit=4)
    with pytest.raises(ValueError, match=r"unknown QSDP option 'polcy'; did you mean 'policy'\?"):
        QSDPConfig.from_preset(polcy="auto")
    with pytest.raises(ValueError, match=r"unknown policy 'autp'; did you mean 'auto'\?; allowed: auto, fixed"):
        QSDPConfig.from_preset(policy="autp")
    with pytest.raises(ValueError, match=r"unknown QSDP preset 'sdp4bits'; did you mean 'sdp4bit'\?"):
        QSDPConfig.from_preset("sdp4bits")
    with pytest.raises(ValueError, match=r"unknown option 'hadamrd' of codec 'minmax'; did you mean 'hadamard'\?"):
        SideConfig(codec_options={"hadamrd": True})
    with pytest.raises(ValueError, match=r"unknown option 'keyframes' of scheme 'difference'; did you mean "
                                         r"'keyframe_every'\?; allowed: keyframe_every, checkpoint_reference"):
        SideConfig(scheme="difference", scheme_options={"keyframes": 2})


def test_a_recipe_typo_fails_at_the_recipe_check_with_a_suggestion():
    with pytest.raises(RecipeError, match=r"algorithms.qsdp.*unknown QSDP option 'weight_bit'; did you mean "
                                          r"'weight_bits'\?"):
        load_recipe(ROOT / "yamls" / "cpu" / "gpt-tiny-qsdp.yaml", ["algorithms.qsdp.weight_bit=4"])


def test_an_out_of_range_value_names_the_option_the_user_wrote():
    with pytest.raises(ValueError, match=r"options weight_bits=9: .*bits=9 is not supported; allowed: integers 1..8"):
        QSDPConfig.from_preset(weight_bits=9)


def test_flat_options_and_the_typed_config_build_the_same_config():
    assert QSDPConfig.from_preset(**FLAT_OPTIONS) == QSDP(TYPED_CONFIG).config == TYPED_CONFIG
    assert QSDP("sdp4bit").config == QSDPConfig.from_preset("sdp4bit")


def test_qsdp_takes_one_config_and_names_it_for_the_removed_spellings():
    assert list(inspect.signature(QSDP.__init__).parameters) == ["self", "config"]
    for call, spelling in (
        (lambda: QSDP(weight_bits=8), "QSDP(QSDPConfig.from_preset('w8g8', weight_bits=8))"),
        (lambda: QSDP(preset="sdp4bit", grad_bits=8), "QSDP(QSDPConfig.from_preset('sdp4bit', grad_bits=8))"),
        (lambda: QSDP(recipe="w8g4"), "QSDP(QSDPConfig.from_preset('w8g4'))"),
        (lambda: QSDP(policy="auto", auto_options={"warmup_steps": 3}),
         "QSDP(QSDPConfig.from_preset('w8g8', policy='auto', auto_options={'warmup_steps': 3}))"),
        (lambda: QSDP(TYPED_CONFIG, grad_bits=8), "QSDP(QSDPConfig.from_preset('w8g8', grad_bits=8))"),
    ):
        with pytest.raises(TypeError, match=r"QSDP takes one QSDPConfig or a preset name, not keyword options .*; "
                                            r"write " + re.escape(spelling)):
            call()
    with pytest.raises(ValueError, match=r"config=8 is invalid; it must be a QSDPConfig or a preset name"):
        QSDP(8)
    import composer_qsdp.config
    assert not hasattr(composer_qsdp.config, "from_recipe") and not hasattr(composer_qsdp.config, "recipe_names")
    with pytest.raises(AttributeError):
        composer_qsdp.from_recipe


def test_options_become_their_typed_class():
    side = SideConfig(codec="learned", codec_options={"fit_steps": 7}, scheme="difference",
                      scheme_options={"checkpoint_reference": False})
    assert side.codec_options == LearnedOptions(fit_steps=7)
    assert side.scheme_options == DifferenceOptions(checkpoint_reference=False)
    with pytest.raises(ValueError, match=r"codec 'learned' takes LearnedOptions, got CodecOptions"):
        SideConfig(codec="learned", codec_options=CodecOptions())
    with pytest.raises(ValueError, match=r"fit_steps=0 is invalid; it must be an integer >= 1"):
        LearnedOptions(fit_steps=0)


@pytest.mark.parametrize("table,name", [(t, n) for t in (CODECS, WEIGHT_SCHEMES, GRAD_SCHEMES) for n in t.names()])
def test_option_classes_mirror_their_constructors(table, name):
    """Every registered codec and scheme has an option class whose fields and defaults are its constructor's
    (``SideConfig`` holds a codec's ``bits``, ``bucket_size`` and ``rounding``)."""
    cls, options = table.lookup(name), table.options(name)
    if table is CODECS:
        skip = {"bits", "bucket_size", "rounding"}
        expected = {"hadamard": inspect.signature(make_codec).parameters["hadamard"].default}
    else:
        skip, expected = {"codec", "error_sample_interval"}, {}
    expected |= {p.name: p.default for p in inspect.signature(cls).parameters.values() if p.name not in skip}
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(options)}  # a mapping default is a factory's fresh dict
    assert defaults == expected


@pytest.mark.parametrize("preset", preset_names())
def test_presets_encode_the_same_bytes_as_their_raw_options(preset):
    """A preset's typed codec encodes exactly as ``make_codec`` with the preset's raw option mapping."""
    raw = PRESETS.lookup(preset)
    config = QSDPConfig.from_preset(preset)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(0))
    for prefix, side in (("weight_", config.weights), ("grad_", config.grads)):
        codec = build_codec(side, side.bits)
        rounding = {"rounding": raw[prefix + "rounding"]} if prefix + "rounding" in raw else {}
        reference = make_codec(raw.get(prefix + "codec", "minmax"), bits=raw.get(prefix + "bits", 8),
                               bucket_size=raw.get(prefix + "bucket_size", 1024), **rounding,
                               **raw.get(prefix + "codec_options", {}))
        assert torch.equal(codec.encode(x, seed=5, offset=0), reference.encode(x, seed=5, offset=0))


def test_apply_qsdp_refuses_an_unsharded_model():
    with pytest.raises(ValueError, match=r"Linear is not sharded by FSDP: .* shard it first"):
        apply_qsdp(nn.Linear(2, 2), "w8g8")
    with pytest.raises(ValueError, match=r"config=8 is invalid; it must be a QSDPConfig or a preset name"):
        apply_qsdp(nn.Linear(2, 2), 8)


def _flat_and_typed(info: RankInfo) -> dict:
    adapter = Adapter("fsdp2")
    out = {}
    model = adapter.shard(info)
    handle = adapter.apply(model, QSDPConfig.from_preset(**FLAT_OPTIONS))  # the adapter's own entry, flat options
    out["flat"] = (_train(info, model, 4, grads=False)["losses"], handle.traffic())
    model = adapter.shard(info)
    handle = apply_qsdp(model, TYPED_CONFIG)  # the one public entry, typed config
    out["typed"] = (_train(info, model, 4, grads=False)["losses"], handle.traffic())
    return out


@pytest.mark.slow  # flat options; the typed config is exercised by every other training test
@pytest.mark.requires_custom_comm
def test_flat_options_and_typed_config_train_identically():
    """Same losses and the same bytes on 2 gloo ranks (FSDP2), bit for bit."""
    if torch.__version__ < "2.7":
        pytest.skip(f"FSDP2 cannot run on CPU with torch {torch.__version__}")
    for rank in run_ranks(_flat_and_typed, 2):
        flat_losses, flat_traffic = rank["flat"]
        typed_losses, typed_traffic = rank["typed"]
        assert flat_losses == typed_losses
        assert flat_traffic.summary() == typed_traffic.summary() and flat_traffic.total.sent > 0


@pytest.mark.parametrize("make,label", [
    (lambda: QSDP(QSDPConfig.from_preset("w8g8")), "w8g8"),
    (lambda: QSDP(QSDPConfig.from_preset("qwd-w4g2-loco")), "qwd-w4g2-loco"),
    (lambda: QSDP(QSDPConfig()), "w8g8"),
    (lambda: QSDP(QSDPConfig.from_preset("w8g4", grad_bits=4)), "w8g4"),  # the preset's own value: still exactly it
    (lambda: QSDP(QSDPConfig.from_preset("w8g4", seed=3)), "w8g4+custom"),
    (lambda: QSDP(dataclasses.replace(QSDPConfig.from_preset("w8g4"), seed=3)), "custom"),  # built, not from_preset
    (lambda: QSDP(QSDPConfig.from_preset(policy="auto")), "auto"),
])
def test_the_logged_preset_names_the_preset_the_config_equals(make, label):
    assert make().preset_label() == label
