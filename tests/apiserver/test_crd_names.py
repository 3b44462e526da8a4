"""Names two CustomResourceDefinitions of a group both claim: the second waits, as
kube-apiserver's naming controller makes it (NamesAccepted False, not Established, not served)."""

from __future__ import annotations

import asyncio
from typing import Any

from apiserver_helpers import Api
from crd_fixtures import CRDS, widget_crd

from gpufleet.api import apiextensions as crds

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def other_crd(plural: str, kind: str, group: str = "example.com", **names: Any) -> dict[str, Any]:
    crd = widget_crd(group=group)
    crd["metadata"]["name"] = f"{plural}.{group}"
    crd["spec"]["names"] = {"plural": plural, "kind": kind, **names}
    return crd


def conditions(crd: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in crd["status"]["conditions"]}


async def served_resources(api: Api, group: str) -> set[str]:
    doc = (await api.get("/apis", accept=AGGREGATED)).json
    return {r["resource"] for g in doc["items"] if g["metadata"]["name"] == group
            for v in g["versions"] for r in v["resources"]}


async def test_a_second_crd_claiming_a_kind_waits_until_the_first_goes(api: Api) -> None:
    assert (await api.post(CRDS, widget_crd())).status == 201
    r = await api.post(CRDS, other_crd("gizmos", "Widget", singular="gizmo", listKind="GizmoList"))
    assert r.status == 201, r
    c = conditions(r.json)
    assert c["NamesAccepted"] == ("False", "KindConflict", '"Widget" is already in use')
    assert c["Established"] == ("False", "NotAccepted", "not all names are accepted")
    assert r.json["status"]["acceptedNames"] == {"plural": "gizmos", "singular": "gizmo", "listKind": "GizmoList"}
    assert (await api.get("/apis/example.com/v1/namespaces/default/gizmos")).status == 404
    assert await served_resources(api, "example.com") == {"widgets"}
    # Its names stay with the first; the first's are untouched.
    first = (await api.get(f"{CRDS}/widgets.example.com")).json
    assert conditions(first)["NamesAccepted"][0] == "True"

    assert (await api.delete(f"{CRDS}/widgets.example.com")).status in (200, 202)
    for _ in range(100):
        got = (await api.get(f"{CRDS}/gizmos.example.com")).json
        if conditions(got)["Established"][0] == "True":
            break
        await asyncio.sleep(0.05)
    c = conditions(got)
    assert c["NamesAccepted"] == ("True", "NoConflicts", "no conflicts found")
    assert c["Established"][0] == "True"
    assert got["status"]["acceptedNames"]["kind"] == "Widget"
    r = await api.post("/apis/example.com/v1/namespaces/default/gizmos",
                       {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "g"},
                        "spec": {"color": "red"}})
    assert r.status == 201, r
    assert await served_resources(api, "example.com") == {"gizmos"}


async def test_short_names_list_kinds_and_singulars_conflict_too(api: Api) -> None:
    assert (await api.post(CRDS, widget_crd())).status == 201  # Widget, widget, wd, WidgetList
    cases = [
        (other_crd("thingies", "Thingy", shortNames=["wd"]), "ShortNamesConflict", '"wd" is already in use'),
        (other_crd("doohickeys", "Doohickey", listKind="WidgetList"), "ListKindConflict",
         '"WidgetList" is already in use'),
        (other_crd("whatsits", "Whatsit", singular="widget"), "SingularConflict", '"widget" is already in use'),
        # A singular that is another's plural.
        (other_crd("gadgets", "Gadget", singular="widgets"), "SingularConflict", '"widgets" is already in use'),
    ]
    for crd, reason, message in cases:
        r = await api.post(CRDS, crd)
        assert r.status == 201, r
        c = conditions(r.json)
        assert c["NamesAccepted"] == ("False", reason, message), crd["metadata"]["name"]
        assert c["Established"][0] == "False"
    assert await served_resources(api, "example.com") == {"widgets"}
    # Another group may use the same names.
    r = await api.post(CRDS, other_crd("widgets", "Widget", group="example.org", shortNames=["wd"]))
    assert conditions(r.json)["Established"][0] == "True"


async def test_names_of_a_built_in_kind_of_the_group_are_taken(api: Api) -> None:
    r = await api.post(CRDS, other_crd("trainings", "PyTorchJob", group="kubeflow.org",
                                             singular="training", listKind="TrainingList"))
    assert r.status == 201, r
    assert conditions(r.json)["NamesAccepted"] == ("False", "KindConflict", '"PyTorchJob" is already in use')
    assert (await api.get("/apis/kubeflow.org/v1/namespaces/default/trainings")).status == 404
    r = await api.post(CRDS, other_crd("gangs", "Gang", group="scheduling.x-k8s.io", shortNames=["pg"]))
    assert conditions(r.json)["NamesAccepted"] == ("False", "ShortNamesConflict", '"pg" is already in use')


async def test_an_established_crd_asking_for_a_taken_short_name_keeps_its_old_names(api: Api) -> None:
    assert (await api.post(CRDS, widget_crd())).status == 201
    r = await api.post(CRDS, other_crd("gadgets", "Gadget", shortNames=["gd"]))
    gadgets = r.json
    gadgets["spec"]["names"]["shortNames"] = ["gd", "wd"]
    r = await api.put(f"{CRDS}/gadgets.example.com", gadgets)
    assert r.status == 200, r
    got = (await api.get(f"{CRDS}/gadgets.example.com")).json
    c = conditions(got)
    assert c["NamesAccepted"] == ("False", "ShortNamesConflict", '"wd" is already in use')
    assert c["Established"][0] == "True"  # still served, under the names it had
    assert got["status"]["acceptedNames"]["shortNames"] == ["gd"]
    assert (await api.get("/apis/example.com/v1/namespaces/default/gadgets")).status == 200


# -- the decision ---------------------------------------------------------------------------------


def test_decide_names_keeps_what_is_already_accepted() -> None:
    crd = other_crd("gizmos", "Widget")
    naming = crds.decide_names(crd, {"widgets", "widget"}, {"Widget", "WidgetList"})
    # Each name is looked at in turn; the last conflict found is the one reported.
    assert naming.names_accepted == ("False", "ListKindConflict", '"WidgetList" is already in use')
    assert naming.established == ("False", "NotAccepted", "not all names are accepted")
    assert naming.accepted == {"plural": "gizmos"}
    # Names it holds already are its own, even if the sets name them.
    crd["status"] = {"acceptedNames": {"plural": "gizmos", "singular": "widget", "kind": "Widget",
                                       "listKind": "WidgetList"},
                     "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                                     "message": "the initial names have been accepted"}]}
    crd["spec"]["names"]["singular"] = "widget"
    naming = crds.decide_names(crd, {"widget"}, {"Widget", "WidgetList"})
    assert naming.names_accepted[0] == "True" and naming.established[0] == "True"


def test_several_conflicting_short_names_are_listed() -> None:
    crd = other_crd("gizmos", "Gizmo", shortNames=["a", "b", "c"])
    naming = crds.decide_names(crd, {"a", "c"}, set())
    assert naming.names_accepted == ("False", "ShortNamesConflict", '["a" is already in use, "c" is already in use]')
    assert "shortNames" not in naming.accepted and naming.accepted["kind"] == "Gizmo"


def test_the_oldest_crd_keeps_a_name_both_claim() -> None:
    old = other_crd("widgets", "Widget")
    old["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    new = other_crd("gizmos", "Widget")
    new["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    namings = crds.decide_all_names([new, old], [])
    assert namings["widgets.example.com"].names_accepted[0] == "True"
    assert namings["gizmos.example.com"].names_accepted[0] == "False"
    assert "kind" not in namings["gizmos.example.com"].accepted
    # Once granted, a name stays with its holder even against an older claimant.
    new["status"] = {"acceptedNames": namings["gizmos.example.com"].accepted | {"kind": "Widget"}}
    namings = crds.decide_all_names([new, old], [])
    assert namings["widgets.example.com"].names_accepted[1] == "KindConflict"
