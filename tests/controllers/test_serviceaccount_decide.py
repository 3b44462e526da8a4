"""A namespace's ServiceAccount ``default`` and ``kube-root-ca.crt`` as plain decisions: the
cached object in; its create or update out."""

from __future__ import annotations

from gpufleet.api.k8s import ConfigMap, ServiceAccount
from gpufleet.controllers.serviceaccount import (
    DESCRIPTION,
    DESCRIPTION_ANNOTATION,
    decide_root_ca,
    decide_service_account,
)


def test_a_namespace_without_its_default_service_account_gets_one():
    (create,) = decide_service_account("team", None).creates
    assert create.body["metadata"] == {"name": "default", "namespace": "team"} and create.on_exists == "ignore"
    sa = ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": "team"}})
    assert decide_service_account("team", sa).empty


def test_the_root_ca_is_published_put_back_when_edited_and_left_when_in_sync():
    assert decide_root_ca("team", None, None).empty
    (create,) = decide_root_ca("team", "PEM", None).creates
    assert create.body["data"] == {"ca.crt": "PEM"}
    assert create.body["metadata"]["annotations"] == {DESCRIPTION_ANNOTATION: DESCRIPTION}
    edited = ConfigMap.from_dict({"metadata": {"name": "kube-root-ca.crt", "namespace": "team",
                                               "annotations": {"mine": "x"}, "resourceVersion": "7"},
                                  "data": {"ca.crt": "OTHER"}, "binaryData": {"b": "AA=="}})
    (update,) = decide_root_ca("team", "PEM", edited).updates
    assert update.body["data"] == {"ca.crt": "PEM"} and "binaryData" not in update.body
    assert update.body["metadata"]["annotations"] == {"mine": "x", DESCRIPTION_ANNOTATION: DESCRIPTION}
    assert update.body["metadata"]["resourceVersion"] == "7"
    in_sync = ConfigMap.from_dict(update.body)
    assert decide_root_ca("team", "PEM", in_sync).reason == "InSync"
