"""gpufleet.utils.jsoncodec: the standard library's values and errors, at orjson's speed."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.utils import jsoncodec

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=20)


def _same(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@given(value=_JSON)
def test_what_is_written_reads_back_as_the_standard_library_reads_it(value) -> None:
    text = jsoncodec.dumps(value)
    assert _same(jsoncodec.loads(text), json.loads(text))
    assert _same(jsoncodec.loads(text), value)
    assert _same(json.loads(text), value)


def test_what_the_standard_library_refuses_is_refused() -> None:
    with pytest.raises(ValueError):
        jsoncodec.loads(b"{not json")
    with pytest.raises(TypeError):
        jsoncodec.dumps({"when": object()})
    import datetime

    with pytest.raises(TypeError):
        jsoncodec.dumps({"when": datetime.datetime(2026, 1, 1)})
    assert jsoncodec.dumps({1: "a"}) == b'{"1":"a"}'  # as json.dumps writes a key that is not a string
