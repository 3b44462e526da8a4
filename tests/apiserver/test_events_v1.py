"""events.k8s.io/v1 Events are the core v1 Events in another shape: one written in either
version reads in both, converted field by field as Kubernetes does; list, watch, patch,
field selectors of the v1 shape, and the Table `kubectl get events.events.k8s.io` prints."""

from __future__ import annotations

from apiserver_helpers import EVENTS, TABLE_ACCEPT, Api, assert_status

V1 = "/apis/events.k8s.io/v1/namespaces/default/events"
CORE = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "core"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}, "reason": "Started",
        "message": "started it", "type": "Normal", "source": {"component": "kubelet", "host": "n1"}, "count": 3,
        "firstTimestamp": "2024-01-01T00:00:00Z", "lastTimestamp": "2024-01-01T00:00:05Z",
        "reportingComponent": "kubelet", "reportingInstance": "n1"}
NEW = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "new"},
       "regarding": {"kind": "Pod", "name": "q", "namespace": "default"}, "reason": "Pulled", "note": "pulled",
       "type": "Warning", "eventTime": "2024-01-01T00:00:02.000000Z", "action": "Pull",
       "reportingController": "gpufleet.io/agent", "reportingInstance": "n2",
       "series": {"count": 2, "lastObservedTime": "2024-01-01T00:00:09.000000Z"}}


async def test_one_event_in_two_versions(api: Api) -> None:
    assert (await api.post(EVENTS, CORE)).status == 201
    made = await api.post(V1, NEW)
    assert made.status == 201, made
    assert {k: made.json[k] for k in ("apiVersion", "regarding", "note", "reportingController")} == {
        "apiVersion": "events.k8s.io/v1", "regarding": NEW["regarding"], "note": "pulled",
        "reportingController": "gpufleet.io/agent"}

    as_v1 = (await api.get(f"{V1}/core")).json
    assert {k: as_v1.get(k) for k in ("apiVersion", "regarding", "note", "deprecatedSource", "deprecatedCount",
                                      "deprecatedFirstTimestamp", "deprecatedLastTimestamp", "reportingController",
                                      "reportingInstance", "involvedObject", "message")} == {
        "apiVersion": "events.k8s.io/v1", "regarding": CORE["involvedObject"], "note": "started it",
        "deprecatedSource": CORE["source"], "deprecatedCount": 3, "deprecatedFirstTimestamp": "2024-01-01T00:00:00Z",
        "deprecatedLastTimestamp": "2024-01-01T00:00:05Z", "reportingController": "kubelet",
        "reportingInstance": "n1", "involvedObject": None, "message": None}
    as_core = (await api.get(f"{EVENTS}/new")).json
    assert {k: as_core.get(k) for k in ("apiVersion", "involvedObject", "message", "reportingComponent", "action",
                                        "series", "regarding")} == {
        "apiVersion": "v1", "involvedObject": NEW["regarding"], "message": "pulled",
        "reportingComponent": "gpufleet.io/agent", "action": "Pull",
        "series": {"count": 2, "lastObservedTime": "2024-01-01T00:00:09Z"}, "regarding": None}

    listed = (await api.get(V1)).json
    assert listed["kind"] == "EventList" and listed["apiVersion"] == "events.k8s.io/v1"
    assert sorted(i["note"] for i in listed["items"]) == ["pulled", "started it"]
    picked = (await api.get(V1, query={"fieldSelector": "regarding.name=q,reportingController=gpufleet.io/agent"})).json
    assert [i["metadata"]["name"] for i in picked["items"]] == ["new"]
    assert_status(await api.get(V1, query={"fieldSelector": "involvedObject.name=q"}), 400, "BadRequest")

    patched = await api.patch(f"{V1}/core", {"note": "restarted it"})
    assert patched.status == 200 and patched.json["note"] == "restarted it"
    assert (await api.get(f"{EVENTS}/core")).json["message"] == "restarted it"

    table = (await api.get(V1, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]][:5] == ["Last Seen", "Type", "Reason", "Object",
                                                                   "Subobject"]
    assert {r["cells"][2] for r in table["rows"]} == {"Started", "Pulled"}


async def test_watch_in_the_v1_shape(api: Api) -> None:
    stream = await api.watch(V1, {"fieldSelector": "regarding.name=q"})
    try:
        await api.post(EVENTS, {**CORE, "metadata": {"name": "other"}})
        await api.post(EVENTS, {**CORE, "metadata": {"name": "for-q"}, "involvedObject": NEW["regarding"]})
        event = await stream.next()
        assert event is not None and event["type"] == "ADDED"
        assert (event["object"]["metadata"]["name"], event["object"]["apiVersion"], event["object"]["note"]) == (
            "for-q", "events.k8s.io/v1", "started it")
    finally:
        await stream.close()
