"""make_codec: names and options are checked before a codec is built, with a ValueError naming what is wrong."""

import pytest

from composer_qsdp.quant import codec_names, make_codec
from composer_qsdp.quant.minmax import MinMaxCodec


@pytest.mark.parametrize("name", [["minmax"], ("minmax",), None, 3, "MinMax", "hadamard"])
def test_unknown_or_non_string_names_raise_value_error_listing_the_codecs(name):
    allowed = ", ".join(sorted(codec_names()))
    with pytest.raises(ValueError, match=rf"unknown codec .*; allowed: {allowed}$"):
        make_codec(name)


def test_codec_names_are_the_registered_codecs_in_order():
    assert codec_names() == ("minmax", "random_shift", "learned", "symmetric")
    assert type(make_codec("minmax", bits=4)) is MinMaxCodec


def test_unknown_options_are_named_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"invalid option for codec 'minmax': colour, size; allowed: bits, "
                                         r"bucket_size, rounding, hadamard$"):  # fmt: skip
        make_codec("minmax", colour=1, size=2)
