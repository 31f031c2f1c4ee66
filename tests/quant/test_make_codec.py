"""make_codec: names and options are checked before a codec is built, with a ValueError naming what is wrong."""

import re

import pytest

from composer_qsdp.quant import MAX_BUCKET_SIZE, MinMaxCodec, codec_names, make_codec


@pytest.mark.parametrize("name", [["minmax"], ("minmax",), None, 3, "MinMax", "hadamard"])
def test_unknown_or_non_string_names_raise_value_error_listing_the_codecs(name):
    allowed = ", ".join(sorted(codec_names()))
    with pytest.raises(ValueError, match=rf"unknown codec .*; allowed: {allowed}$"):
        make_codec(name)


def test_codec_names_are_the_registered_codecs_in_order():
    assert codec_names() == ("minmax", "random_shift", "learned", "symmetric", "sign")
    assert type(make_codec("minmax", bits=4)) is MinMaxCodec


def test_unknown_options_are_named_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"invalid option for codec 'minmax': colour, size; allowed: bits, "
                                         r"bucket_size, rounding, hadamard$"):  # fmt: skip
        make_codec("minmax", colour=1, size=2)


@pytest.mark.parametrize("name, option, value, allowed", [
    ("minmax", "hadamard", "false", "it must be True or False"),
    ("minmax", "hadamard", 1, "it must be True or False"),
    ("symmetric", "hadamard", None, "it must be True or False"),
    ("minmax", "rounding", ["nearest"], "allowed: stochastic, nearest"),
    ("minmax", "rounding", None, "allowed: stochastic, nearest"),
    ("minmax", "bits", True, r"allowed: integers 1\.\.8"),
    ("symmetric", "bits", 4.0, r"allowed: integers 2\.\.8"),
    ("random_shift", "bucket_size", "64", r"it must be an integer in 1\.\.16777216"),
    ("random_shift", "bucket_size", False, r"it must be an integer in 1\.\.16777216"),
    ("learned", "refresh_every", True, "it must be an integer >= 0"),
    ("learned", "fit_samples", 8.0, "it must be an integer >= 1"),
    ("learned", "fit_steps", "3", "it must be an integer >= 1"),
    ("learned", "pinned_seeds", None, "it must be an integer >= 1"),
])  # fmt: skip
def test_every_option_is_type_checked_naming_the_option_the_value_and_what_is_allowed(name, option, value, allowed):
    """Each option of each codec (and ``hadamard``) rejects a value of the wrong type, a bool where an int is
    meant included: ``hadamard="false"`` used to switch the rotation on."""
    with pytest.raises(ValueError, match=rf"{option}={re.escape(repr(value))} .*{allowed}"):
        make_codec(name, **{"bits": 4, "bucket_size": 64, option: value})


def test_hadamard_false_leaves_the_codec_unrotated():
    assert type(make_codec("minmax", bits=4, bucket_size=64, hadamard=False)) is MinMaxCodec
    assert make_codec("minmax", bits=4, bucket_size=64, hadamard=True).name == "hadamard"


@pytest.mark.parametrize("name", codec_names())
@pytest.mark.parametrize("bucket_size", [2**24 + 1, 2**28, 2**40])
def test_bucket_size_is_bounded_at_validation(name, bucket_size):
    """A bucket of 2**40 elements used to pass validation and then ask for terabytes on the first encode."""
    bits = 1 if name == "sign" else 4
    with pytest.raises(ValueError, match=rf"bucket_size={bucket_size} is invalid; it must be an integer in "
                                         rf"1\.\.{MAX_BUCKET_SIZE} \(2\*\*24 elements per bucket\)"):  # fmt: skip
        make_codec(name, bits=bits, bucket_size=bucket_size)
    assert make_codec(name, bits=bits, bucket_size=MAX_BUCKET_SIZE).bucket_size == 2**24
