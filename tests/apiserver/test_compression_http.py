"""Response compression as kube-apiserver's (APIResponseCompression): a GET answer over 128 KiB
goes gzip-compressed to a client that accepts gzip, and as it is to one that does not; small
answers, writes and watches are never compressed; a very large one is sent as it is
compressed."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from apiserver_helpers import CONFIGMAPS, Api

from gpufleet.apiserver import app
from gpufleet.apiserver.app import GZIP_THRESHOLD, HttpServer, accepts_gzip


def test_which_accept_encodings_admit_gzip() -> None:
    assert accepts_gzip("gzip") and accepts_gzip("gzip, deflate") and accepts_gzip("br;q=1.0, GZIP;q=0.5")
    assert accepts_gzip("*")
    assert not accepts_gzip("") and not accepts_gzip("identity") and not accepts_gzip("deflate, br")
    assert not accepts_gzip("gzip;q=0") and not accepts_gzip("gzip;q=0.0, identity")
    assert not accepts_gzip("gzip;q=nonsense")


async def configmaps(api: Api) -> None:
    for i in range(40):  # 40 ConfigMaps of 8 KB: a list of about 330 KB
        await api.post(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"},
                                    "data": {"blob": f"{i:04d}" * 2000}})


@contextlib.asynccontextmanager
async def http_client(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    server = HttpServer(api.server, port=0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as http:
            yield http
    finally:
        await server.stop()


async def test_a_large_list_is_sent_compressed_to_a_client_that_accepts_gzip(api: Api) -> None:
    await configmaps(api)
    async with http_client(api) as http:
        plain = await http.get(CONFIGMAPS, headers={"accept-encoding": "identity"})
        assert plain.status_code == 200 and "content-encoding" not in plain.headers
        assert len(plain.content) > GZIP_THRESHOLD

        # Read as sent on the wire, then by hand: the same document, much smaller.
        async with http.stream("GET", CONFIGMAPS, headers={"accept-encoding": "gzip"}) as resp:
            wire = b"".join([chunk async for chunk in resp.aiter_raw()])
        assert resp.headers["content-encoding"] == "gzip"
        assert int(resp.headers["content-length"]) == len(wire) < len(plain.content) // 10
        assert orjson.loads(gzip.decompress(wire)) == plain.json()

        # httpx asks for gzip by default and decodes it: a client sees the same list.
        assert (await http.get(CONFIGMAPS)).json() == plain.json()

        small = await http.get(f"{CONFIGMAPS}/cm-1", headers={"accept-encoding": "gzip"})
        assert small.status_code == 200 and "content-encoding" not in small.headers
        failed = await http.get(f"{CONFIGMAPS}/missing", headers={"accept-encoding": "gzip"})
        assert failed.status_code == 404 and "content-encoding" not in failed.headers


async def test_a_very_large_answer_is_sent_as_it_is_compressed(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # Over GZIP_STREAM_THRESHOLD the body goes out piece by piece, chunked: one gzip stream.
    monkeypatch.setattr(app, "GZIP_STREAM_THRESHOLD", 200 * 1024)
    monkeypatch.setattr(app, "GZIP_PIECE", 64 * 1024)
    await configmaps(api)
    async with http_client(api) as http:
        plain = await http.get(CONFIGMAPS, headers={"accept-encoding": "identity"})
        async with http.stream("GET", CONFIGMAPS, headers={"accept-encoding": "gzip"}) as resp:
            pieces = [chunk async for chunk in resp.aiter_raw()]
        assert resp.headers["content-encoding"] == "gzip"
        assert "content-length" not in resp.headers and resp.headers["transfer-encoding"] == "chunked"
        assert orjson.loads(gzip.decompress(b"".join(pieces))) == plain.json()
        assert (await http.get(CONFIGMAPS)).json() == plain.json()
