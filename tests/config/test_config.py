"""SideConfig / QSDPConfig validation, the named presets and their flat options (no process group needed)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import warnings
from pathlib import Path

import pytest

from composer_qsdp.config import (LowBitGradientWarning, QSDPConfig, SideConfig, from_preset, option_names,
                                  preset_names)
from composer_qsdp.config import presets
from composer_qsdp.config.options import CodecOptions, FlatOptions, TwoLevelOptions
from composer_qsdp.quant import Codec
from composer_qsdp.schemes import DirectAllGather, FlatReduceScatter, Scheme, build_scheme


def test_defaults_are_the_paper_headline_setting():
    config = QSDPConfig()
    for name, side in (("weights", config.weights), ("grads", config.grads)):
        scheme = build_scheme(name, side, 8)
        assert (side.bits, side.codec, side.bucket_size) == (8, "minmax", 1024)
        # rounding=None: the min-max codec's default, stochastic (unbiased)
        assert scheme.codec.name == "minmax" and scheme.codec.rounding == "stochastic" and scheme.codec.unbiased
    assert isinstance(build_scheme("weights", config.weights, 8), DirectAllGather)
    assert isinstance(build_scheme("grads", config.grads, 8), FlatReduceScatter)
    assert config == from_preset("w8g8") == from_preset()


@pytest.mark.parametrize("kwargs,message", [  # lambdas: SideConfig validates at construction too
    (lambda: dict(weights=SideConfig(bits=9)), r"weights: codec 'minmax'.*bits=9 is not supported"),
    (lambda: dict(grads=SideConfig(bits=0)), r"grads: codec 'minmax'.*bits=0"),
    (lambda: dict(weights=SideConfig(bits=8.0)), r"bits=8.0 is invalid"),
    (lambda: dict(grads=SideConfig(codec="nope")), r"unknown codec 'nope'"),
    (lambda: dict(weights=SideConfig(rounding="up")), r"rounding='up' is not supported"),
    (lambda: dict(weights=SideConfig(bucket_size=0)), r"bucket_size=0 is invalid"),
    (lambda: dict(min_numel=-5), r"min_numel=-5 is invalid"),
    (lambda: dict(error_sample_interval=1.5), r"error_sample_interval=1.5 is invalid"),
    (lambda: dict(exclude="*.wte"), r"exclude='\*.wte' is invalid; it must be a list"),
    (lambda: dict(exclude=[3]), r"exclude contains 3"),
    (lambda: dict(grads=SideConfig(bits_overrides={"head": 12})), r"grads: codec .*bits=12"),
    (lambda: dict(weights=SideConfig(bits_overrides=["head"])), r"bits_overrides=\['head'\] is invalid; it must be a mapping"),
    (lambda: dict(seed=-1), r"seed=-1 is invalid"),
    (lambda: dict(seed=2**32), r"seed=4294967296 is invalid; it must be an integer in \[0, 2\*\*32\)$"),
    (lambda: dict(check_finite="yes"), r"check_finite='yes' is invalid"),
    (lambda: dict(separate_grad_group=1), r"separate_grad_group=1 is invalid; it must be True or False"),
    (lambda: dict(grads=SideConfig(codec_options={"colour": 1})), r"unknown option 'colour' of codec 'minmax'; allowed: hadamard"),
    (lambda: dict(weights=SideConfig(codec_options={"bits": 4})), r"unknown option 'bits' of codec 'minmax'"),
    (lambda: dict(grads=SideConfig(codec="symmetric", rounding="nearest")), r"invalid option for codec 'symmetric'"),
    (lambda: dict(weights=SideConfig(scheme="flat")), r"unknown weight scheme 'flat'; allowed: difference, direct"),
    (lambda: dict(grads=SideConfig(scheme_options={"hops": 2})), r"unknown option 'hops' of scheme 'flat'; allowed: none"),
    (lambda: dict(weights=8), r"weights=8 is invalid; it must be a SideConfig"),
    (lambda: dict(module_filter="blocks"), r"module_filter='blocks' is invalid; it must be callable"),
    (lambda: dict(ranks_per_node=0), r"ranks_per_node=0 is invalid"),
])
def test_bad_options_raise_value_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QSDPConfig(**kwargs())


@pytest.mark.parametrize("codec", ["symmetric", "random_shift", "learned"])
def test_codecs_without_a_rounding_option_work_with_the_defaults(codec):
    config = QSDPConfig(weights=SideConfig(codec=codec, codec_options={"hadamard": True}),
                        grads=SideConfig(codec=codec, bits=4))
    assert build_scheme("grads", config.grads, 4).codec.bits == 4
    assert build_scheme("weights", config.weights, 8).codec.name == "hadamard"


def _objects(value):
    """Every value reachable through ``value``'s dataclass fields, mappings and sequences."""
    yield value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _objects(getattr(value, f.name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _objects(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _objects(item)


@pytest.mark.parametrize("name", preset_names())
def test_a_config_is_plain_data_holding_no_scheme_or_codec(name):
    config = from_preset(name, weight_bits_overrides={"head": None})
    assert not [v for v in _objects(config) if isinstance(v, (Scheme, Codec))]
    assert copy.deepcopy(config) == config and {f.name for f in dataclasses.fields(config)} == {
        "weights", "grads", "exclude", "module_filter", "min_numel", "seed", "check_finite", "error_sample_interval",
        "ranks_per_node", "policy", "auto_options", "eval_weights", "separate_grad_group", "speculative_update",
        "preset"}


def test_each_unit_gets_its_own_scheme_and_codec_built_from_the_config():
    config = QSDPConfig(grads=SideConfig(codec="learned"))
    first, second = build_scheme("grads", config.grads, 8), build_scheme("grads", config.grads, 8)
    assert first is not second and first.codec is not second.codec  # learned levels are per-unit state
    assert repr(first.codec) == repr(second.codec)
    assert build_scheme("weights", config.weights, None).codec is None  # unquantized units: the default scheme, no codec
    difference = from_preset("sdp4bit")
    assert build_scheme("weights", difference.weights, None).name == "direct"  # whatever the side's scheme
    assert build_scheme("weights", difference.weights, 4, "direct").name == "direct"  # an override: its defaults


@pytest.mark.parametrize("call,message", [
    (lambda: from_preset("qwd-w4g3-loco", grad_scheme_options={"residual_dtype": "float16"}),
     r"residual_dtype='float16' is not supported; allowed: float32, bfloat16, int8"),
    (lambda: from_preset("tlq-hs", grad_scheme_options={"rotation_block": 48}),
     r"rotation_block=48 is invalid; allowed: a power of two"),
    (lambda: from_preset("tlq-hs", grad_scheme_options={"intra_codec": {"name": "symmetric", "bits": 1}}),
     r"intra_codec=\{'name': 'symmetric', 'bits': 1\}: bits=1 is not supported"),
    (lambda: from_preset("tlq-hs", grad_scheme_options={"intra_codec": "symmetric"}),
     r"intra_codec='symmetric' is invalid; allowed: 'same'"),
    (lambda: from_preset("w8g8", weight_scheme_options={"unquantized_params": [3]}),
     r"unquantized_params=\[3\] is invalid; it must be a list of fnmatch patterns"),
    (lambda: from_preset("w8g8", weight_codec="symmetric", weight_bits=1), r"weights: codec 'symmetric'.*bits=1"),
    (lambda: from_preset("w8g8", grad_codec="minmax", grad_bucket_size=3, grad_codec_options={"hadamard": True}),
     r"grads: codec 'minmax'.*bucket_size"),
])
def test_scheme_and_codec_options_fail_at_construction_naming_the_value(call, message):
    """What a scheme's or codec's constructor refuses, the config refuses first, without building a scheme."""
    with pytest.raises(ValueError, match=message):
        call()


def test_yaml_containers_are_normalized():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"exclude": ["embed"], "overrides": {"head": 4}, "options": {"hadamard": True}})
    config = QSDPConfig(exclude=cfg.exclude,
                        weights=SideConfig(bits_overrides=cfg.overrides, codec_options=cfg.options))
    assert config.exclude == ("embed",) and config.weights.bits_overrides == {"head": 4}
    assert config.weights.codec_options == CodecOptions(hadamard=True)


def test_presets_and_flat_options():
    assert preset_names() == ("w8g8", "w8g4", "w8g4-paper", "w4g4", "zeropp", "tlq-hs", "sdp4bit", "qwd-w4g4",
                              "qwd-w4g2-loco", "qwd-w4g3-loco", "qwd-w3g3-loco", "qwd-w3g2-loco")
    w8g4, paper, loco = from_preset("w8g4"), from_preset("w8g4-paper"), from_preset("qwd-w3g3-loco")
    assert w8g4.weights == paper.weights == from_preset("w8g8").weights
    assert w8g4.grads == dataclasses.replace(loco.grads, bits=4)  # the LoCo presets' gradients at 4 bits
    assert (paper.grads.bits, paper.grads.bucket_size, paper.grads.scheme) == (4, 1024, None)  # min-max, stochastic
    w4g4 = from_preset("w4g4", grad_bits=8, bucket_size=256, weight_bucket_size=2048, exclude=["head"],
                       weight_codec_options={"hadamard": True}, grad_rounding="nearest", seed=3)
    assert (w4g4.weights.bits, w4g4.grads.bits) == (4, 8)  # explicit options win over the preset
    assert (w4g4.weights.bucket_size, w4g4.grads.bucket_size) == (2048, 256)  # per side wins over both
    assert w4g4.weights.codec_options == CodecOptions(hadamard=True) and w4g4.grads.rounding == "nearest"
    assert w4g4.exclude == ("head",) and w4g4.seed == 3
    assert "weight_scheme_options" in option_names() and "ranks_per_node" in option_names()


def test_changing_one_option_of_a_preset_keeps_its_others():
    """A codec or scheme options mapping merges over the preset's (``residual_dtype`` must not reset
    ``qwd-w4g3-loco``'s beta 0.5 to the scheme's default 0.8); with another scheme or codec, over those of the preset's
    options that the new one takes."""
    int8 = from_preset("qwd-w4g3-loco", grad_scheme_options={"residual_dtype": "int8"})
    assert (int8.grads.scheme_options.beta, int8.grads.scheme_options.residual_dtype) == (0.5, "int8")
    assert int8.grads.codec_options == CodecOptions(hadamard=True)
    same = from_preset("qwd-w4g3-loco", grad_scheme="loco", grad_scheme_options={"reset_every": 4})
    assert (same.grads.scheme_options.beta, same.grads.scheme_options.reset_every) == (0.5, 4)
    assert from_preset("qwd-w4g3-loco", grad_scheme="flat", grad_scheme_options={}).grads.scheme == "flat"
    unrotated = from_preset("qwd-w4g3-loco", grad_codec_options={"hadamard": False})
    assert unrotated.grads.codec_options == CodecOptions(hadamard=False)
    assert from_preset("qwd-w4g3-loco", grad_scheme_options={"beta": 0.9}).grads.scheme_options.beta == 0.9
    # another scheme that takes the preset's options keeps them, with or without options of its own
    for given in ({}, {"grad_scheme_options": {"residual_on_host": True}}):
        lean = from_preset("qwd-w4g3-loco", grad_scheme="two_level_loco", **given).grads.scheme_options
        assert (lean.beta, lean.residual_dtype, lean.residual_on_host) == (0.5, "int8", bool(given)), given
    # one that does not take them drops them instead of refusing options the user never gave
    assert from_preset("qwd-w4g3-loco", grad_scheme="flat").grads.scheme_options == FlatOptions()
    rotated = from_preset("qwd-w4g3-loco", grad_scheme="two_level", grad_scheme_options={"rotation_block": 32})
    assert rotated.grads.scheme_options == TwoLevelOptions(rotation_block=32)


@pytest.mark.parametrize("call,message", [
    (lambda: from_preset("w2g2"), r"unknown QSDP preset .w2g2.; allowed: qwd-w3g2-loco, qwd-w3g3-loco, qwd-w4g2-loco, qwd-w4g3-loco, qwd-w4g4, sdp4bit, tlq-hs, w4g4, w8g4, w8g4-paper, w8g8, zeropp"),
    (lambda: from_preset(["w8g8"]), r"unknown QSDP preset \['w8g8'\]"),
    (lambda: from_preset("w8g8", weight_bitz=4), r"unknown QSDP option 'weight_bitz'; did you mean 'weight_bits'\?; allowed: weight_bits"),
    (lambda: from_preset("w8g8", weights=SideConfig()), r"unknown QSDP option 'weights'"),
])
def test_preset_errors_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_summary_is_plain_values():
    config = QSDPConfig(module_filter=lambda module, name: True, exclude=["a"])
    summary = config.summary()
    assert summary["weights"]["bits"] == 8 and summary["exclude"] == ["a"]
    assert "lambda" in summary["module_filter"] and not any(k.startswith("_") for k in summary)


def test_sdp4bit_presets_are_qwd_int4_weights_with_tlq_hs_or_one_hop_4bit_gradients():
    sdp4bit, one_hop = from_preset("sdp4bit"), from_preset("qwd-w4g4")
    for config in (sdp4bit, one_hop):
        weights = build_scheme("weights", config.weights, 4)
        assert weights.name == "difference" and repr(weights.codec) == "SymmetricCodec(bits=4, bucket_size=2048)"
    assert sdp4bit.grads == from_preset("tlq-hs").grads  # SDP4Bit's two halves
    grads = build_scheme("grads", one_hop.grads, 4)
    assert grads.name == "flat" and grads.codec.name == "hadamard" and grads.codec.inner.bits == 4
    assert grads.codec.bucket_size == 128 and grads.codec.unbiased


@pytest.mark.parametrize("make,lossy", [
    (lambda: from_preset("w8g8", grad_bits=2), "flat at 2 bit(s)"),
    (lambda: QSDPConfig(grads=SideConfig(bits=1, codec="sign")), "flat at 1 bit(s)"),
    (lambda: from_preset("tlq-hs", grad_bits=2), "two_level at 2 bit(s)"),
    (lambda: from_preset("w8g4-paper", grad_bits_overrides={"head": 2}), "flat at 2 bit(s)"),
    (lambda: from_preset("qwd-w3g2-loco", grad_scheme="two_level_loco", grad_scheme_options={"intra_codec": "same"}),
     "two_level_loco's intra-node hop (intra_codec='same') at 2 bit(s)"),
])
def test_one_or_two_bit_gradients_without_error_feedback_warn_once_with_the_fix(make, lossy):
    with pytest.warns(LowBitGradientWarning) as caught:
        make()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert lossy in message and "without error feedback" in message and "qwd-w4g2-loco" in message


@pytest.mark.parametrize("make", [
    *(lambda name=name: from_preset(name) for name in preset_names()),
    lambda: from_preset("qwd-w4g4", grad_scheme="loco", grad_bits=1, grad_rounding="nearest"),
    lambda: from_preset("w8g8", grad_bits=3),
    lambda: from_preset("w8g8", weight_bits=2),  # weights: no feedback to give
    lambda: from_preset("qwd-w3g2-loco", grad_scheme="two_level_loco", ranks_per_node=2),  # feedback across nodes
])
def test_error_feedback_or_three_bits_or_more_do_not_warn(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LowBitGradientWarning)
        make()


def test_a_config_names_the_preset_it_equals():
    assert [from_preset(name).matching_preset() for name in preset_names()] == list(preset_names())
    assert QSDPConfig().matching_preset() == "w8g8"  # built field by field, equal to the preset
    assert from_preset("w8g4", seed=1).matching_preset() is None
    assert QSDPConfig(grads=SideConfig(bits=6)).matching_preset() is None


def test_the_presets_import_nothing_of_the_package():
    """settings builds on presets, never the reverse (no import cycle): presets is plain data, named in the
    registry."""
    tree = ast.parse(Path(presets.__file__).read_text())
    imported = [node.module if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names]
    assert not [name for name in imported if name and name.startswith("composer_qsdp")], imported


def test_the_sharded_reference_is_an_option_of_the_difference_scheme():
    from omegaconf import OmegaConf

    from composer_qsdp.config import DifferenceOptions

    config = from_preset("sdp4bit", weight_scheme_options={"sharded_reference": True})
    assert config.weights.scheme_options == DifferenceOptions(sharded_reference=True)
    scheme = build_scheme("weights", config.weights, 4)
    assert scheme.sharded_reference and scheme.keyframe_every == 0 and scheme.checkpoint_reference
    assert not build_scheme("weights", from_preset("sdp4bit").weights, 4).sharded_reference  # the presets keep the replica
    yaml = OmegaConf.create({"sharded_reference": True, "keyframe_every": 50})  # a recipe's section
    assert from_preset("qwd-w4g4", weight_scheme_options=yaml).weights.scheme_options == DifferenceOptions(
        keyframe_every=50, sharded_reference=True)
    with pytest.raises(ValueError, match=r"unknown option 'shard_reference' of scheme 'difference'; did you mean "
                                         r"'sharded_reference'\?; allowed: keyframe_every, checkpoint_reference, "
                                         r"sharded_reference"):
        from_preset("sdp4bit", weight_scheme_options={"shard_reference": True})
    with pytest.raises(ValueError, match="sharded_reference='true' is invalid; it must be True or False"):
        from_preset("sdp4bit", weight_scheme_options={"sharded_reference": "true"})


def test_separate_grad_group_is_a_transport_choice_not_a_quantization_setting():
    separate = QSDPConfig.from_preset("w8g4", separate_grad_group=True)
    assert separate.separate_grad_group and not QSDPConfig().separate_grad_group
    assert separate.matching_preset() == "w8g4"  # the same quantization, so the same preset
    assert "separate_grad_group" not in separate.summary()  # checkpoints compare the summary on resume
    assert separate.summary() == QSDPConfig.from_preset("w8g4").summary()


# ------------------------------------------------------------------------------------------- eval_weights
def test_eval_weights_default_is_exact_and_takes_a_mode_or_a_mapping_by_label():
    assert QSDPConfig().eval_weights == "exact"
    assert QSDPConfig().eval_weights_for("val") == "exact"
    quantized = QSDPConfig.from_preset("w8g4", eval_weights="quantized")
    assert quantized.eval_weights_for("val") == "quantized"
    # Not a quantization setting: the preset still names the config, checkpoints' settings leave it out.
    assert quantized.matching_preset() == "w8g4" and "eval_weights" not in quantized.summary()
    both = QSDPConfig.from_preset("qwd-w4g4", eval_weights={"val": "exact", "val_quantized": "quantized"})
    assert [both.eval_weights_for(label) for label in ("val", "val_quantized", "other")] == [
        "exact", "quantized", "exact"]
    auto = QSDPConfig.from_preset(policy="auto", eval_weights="quantized")
    assert auto.policy == "auto" and auto.eval_weights == "quantized"


@pytest.mark.parametrize("value,message", [
    ("quantised", "eval_weights='quantised' is invalid; allowed: 'exact', 'quantized', or a mapping from evaluator "
                  "label to one of them; did you mean 'quantized'?"),
    ("fp32", "eval_weights='fp32' is invalid; allowed: 'exact', 'quantized', or a mapping from evaluator label to one "
             "of them"),
    ({"val": "exakt"}, "eval_weights['val']='exakt' is invalid; allowed: 'exact', 'quantized'; did you mean 'exact'?"),
    ({"val": None}, "eval_weights['val']=None is invalid; allowed: 'exact', 'quantized'"),
    (True, "eval_weights=True is invalid; it must be one of 'exact', 'quantized' or a mapping"),
    ("both", "eval_weights='both' is a recipe setting (algorithms.qsdp.eval_weights=both builds a second evaluator "
             "'val_quantized'); QSDPConfig takes one mode"),
])
def test_eval_weights_errors_name_the_value_and_the_allowed_ones(value, message):
    with pytest.raises(ValueError) as err:
        QSDPConfig(eval_weights=value)
    assert str(err.value).startswith(message)
    with pytest.raises(ValueError, match="QSDP preset 'w8g8' with options eval_weights="):
        QSDPConfig.from_preset("w8g8", eval_weights=value)
