"""/ui/watch: the dashboard's watches on one stream, each served as the caller's own watch."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import CONFIGMAPS, Api, WatchStream
from conftest import MakeApi

from gpufleet.apiserver.admission import UserInfo

SECRETS = "/api/v1/namespaces/default/secrets"


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def open_watch(api: Api, *paths: str) -> WatchStream:
    r = await api.get("/ui/watch", query=[("path", p) for p in paths])
    assert r.status == 200 and r.raw.stream is not None, r
    return WatchStream(r.raw.stream)


async def test_events_of_each_path_come_tagged_with_its_index(api: Api) -> None:
    await api.create(CONFIGMAPS, configmap("before"))
    rv = (await api.get(CONFIGMAPS)).json["metadata"]["resourceVersion"]
    stream = await open_watch(api, f"{CONFIGMAPS}?resourceVersion={rv}&allowWatchBookmarks=true",
                              "/api/v1/namespaces?labelSelector=team%3Da")
    try:
        await api.create(CONFIGMAPS, configmap("after"))
        await api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": "team-a", "labels": {"team": "a"}}})
        await api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": "other"}})
        got = await stream.take(2)
        by_stream = {ev["stream"]: ev["event"] for ev in got}
        assert by_stream[0]["type"] == "ADDED" and by_stream[0]["object"]["metadata"]["name"] == "after"
        assert by_stream[1]["object"]["metadata"]["name"] == "team-a"  # the selector held
        await stream.quiet()  # "before" (older than the resourceVersion) and "other" never come
    finally:
        await stream.close()


async def test_a_refused_path_says_so_and_the_others_go_on(make_api: MakeApi) -> None:
    async def authenticate(req: Any) -> UserInfo | None:
        return UserInfo(name="alice", groups=["system:authenticated"]) if req.headers.get("authorization") else None

    async def authorize(user: UserInfo, info: Any) -> bool:
        return info.resource != "secrets"

    api = await make_api(authenticator=authenticate, authorizer=authorize)
    token = {"authorization": "Bearer t"}
    r = await api.get("/ui/watch", query=[("path", SECRETS), ("path", CONFIGMAPS)], headers=token)
    assert r.status == 200, r
    stream = WatchStream(r.raw.stream)
    try:
        refused = await stream.next()
        assert refused["stream"] == 0 and refused["status"]["code"] == 403, refused
        assert 'cannot watch resource "secrets"' in refused["status"]["message"]
        assert (await api.post(CONFIGMAPS, configmap("seen"), headers=token)).status == 201
        ev = await stream.next()
        assert ev["stream"] == 1 and ev["event"]["object"]["metadata"]["name"] == "seen", ev
    finally:
        await stream.close()
    # Without a token the whole stream is refused, as one watch would be.
    r = await api.get("/ui/watch", query=[("path", CONFIGMAPS)])
    assert r.status == 401 and r.json["reason"] == "Unauthorized", r


async def test_a_watch_ending_is_said_on_the_stream(api: Api) -> None:
    stream = await open_watch(api, f"{CONFIGMAPS}?timeoutSeconds=1", "/api/v1/namespaces?resourceVersion=1")
    try:
        ends = [ev async for ev in _until_end(stream, 0)]
        assert ends[-1] == {"stream": 0, "end": True}
    finally:
        await stream.close()


async def _until_end(stream: WatchStream, index: int):
    while True:
        ev = await stream.next(within=5)
        assert ev is not None, "the stream closed before the watch's end"
        yield ev
        if ev == {"stream": index, "end": True}:
            return


async def test_paths_that_are_not_collections_are_refused(api: Api) -> None:
    for query in ([], [("path", "https://elsewhere/api/v1/pods")], [("path", "/healthz")],
                  [("path", "/api/v1/pods")] * 17):
        r = await api.get("/ui/watch", query=query)
        assert r.status == 400 and r.json["reason"] == "BadRequest", (query, r)
        assert "path" in r.json["message"]
    r = await api.post("/ui/watch", {})
    assert r.status == 405, r
