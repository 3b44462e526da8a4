"""A list served from the stored JSON texts (Store.list_json) reads as the decoded list
would: stamped_json splices resourceVersion into the object's own metadata, whatever came
before it, and falls back to decoding when it cannot tell."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.store._rows import decode, encode, stamped_json

_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["metadata", "spec", "a", '"metadata":{', "x"]), inner, max_size=3),
                     max_leaves=12)
_meta = st.dictionaries(st.sampled_from(["name", "namespace", "labels", "resourceVersion", '"metadata":{']),
                        _json, max_size=4)


@given(before=st.dictionaries(st.sampled_from(["apiVersion", "kind", "spec", "status", "zz"]), _json, max_size=3),
       meta=st.none() | _meta | _json, after=st.dictionaries(st.sampled_from(["spec", "status", "data"]), _json, max_size=2),
       revision=st.integers(min_value=1, max_value=2**62))
def test_stamped_text_reads_as_the_decoded_object(before, meta, after, revision) -> None:
    obj = dict(before)
    if meta is not None:
        obj["metadata"] = meta
    obj.update({k: v for k, v in after.items() if k not in obj})
    text = encode(obj)
    assert orjson.loads(stamped_json(text, revision)) == decode(text, revision)


def test_the_common_shapes_are_spliced() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {}}
    assert stamped_json(encode(pod), 7) == \
        '{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":"7","name":"p","labels":{"a":"b"}},"spec":{}}'
    assert stamped_json('{"metadata":{}}', 3) == '{"metadata":{"resourceVersion":"3"}}'
    # A template's metadata before the object's own: decoded instead.
    text = encode({"spec": {"template": {"metadata": {"name": "t"}}}, "metadata": {"name": "d"}})
    assert orjson.loads(stamped_json(text, 5))["metadata"] == {"name": "d", "resourceVersion": "5"}
    assert orjson.loads(stamped_json(text, 5))["spec"]["template"]["metadata"] == {"name": "t"}
