"""Toleration.ToleratesTaint, on typed models, wire JSON and the scheduler's tuples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.api import k8s
from gpufleet.api.taints import (
    find_untolerated_taint,
    taint_tuples,
    tolerates,
    tolerates_all,
    tolerates_taint,
    toleration_tuple,
)

TAINT = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}


@pytest.mark.parametrize(("toleration", "expected"), [
    ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
    ({"key": "gpu", "operator": "Exists"}, True),
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "gpu", "operator": "Equal", "value": "a100"}, True),
    ({"key": "gpu", "value": "a100"}, True),  # no operator means Equal
    ({"key": "gpu", "operator": "Equal", "value": "h100"}, False),
    ({"key": "gpu", "operator": "Equal"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": "gpu", "operator": "Lt", "value": "a100"}, False),  # unknown operators match nothing
    ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
])
def test_tolerates(toleration: dict, expected: bool) -> None:
    assert tolerates(toleration, TAINT) is expected
    assert tolerates(k8s.Toleration.model_validate(toleration), k8s.Taint.model_validate(TAINT)) is expected
    assert tolerates_taint(toleration_tuple(toleration), "gpu", "a100", "NoSchedule") is expected


def test_find_untolerated_taint_honours_the_effects_asked_about() -> None:
    taints = [k8s.Taint(key="soft", effect="PreferNoSchedule"), k8s.Taint(key="hard", value="x", effect="NoExecute")]
    assert find_untolerated_taint(taints, [], ["NoSchedule", "NoExecute"]) is taints[1]
    assert find_untolerated_taint(taints, []) is taints[0]
    assert tolerates_all(taints, [k8s.Toleration(key="hard", operator="Exists")], ["NoSchedule", "NoExecute"])
    assert not tolerates_all(taints, [k8s.Toleration(key="hard", operator="Exists")])
    assert tolerates_all(taint_tuples(taints), [("", "Exists", "", "")])
    assert taint_tuples(taints, ["NoExecute"]) == (("hard", "x", "NoExecute"),)


_word = st.sampled_from(["", "a", "b"])


@given(_word, st.sampled_from(["", "Equal", "Exists", "Gt"]), _word, st.sampled_from(["", "NoSchedule", "NoExecute"]),
       _word, _word, st.sampled_from(["NoSchedule", "NoExecute"]))
def test_the_rule(key, op, value, effect, t_key, t_value, t_effect) -> None:
    got = tolerates_taint((key, op, value, effect), t_key, t_value, t_effect)
    expected = ((not effect or effect == t_effect) and (not key or key == t_key)
                and (op == "Exists" or (op in ("", "Equal") and value == t_value)))
    assert got is expected
