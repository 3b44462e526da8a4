"""How a request reaches the API server: over HTTP, or by calling its handler in-process.

Both transports take and give the same things (a path, query pairs, bytes; a RawResponse
with lower-case headers; a stream of lines) and fail the same way (ApiError for an error
answer, TransportError when no answer came), so a component cannot tell which one it runs on.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlsplit

import httpx

from gpufleet.client.errors import TransportError, error_from_response
from gpufleet.utils import jsoncodec
from gpufleet.utils.http import Handler, RawRequest, RawResponse
from gpufleet.utils.tlsbuffer import use_small_tls_buffers

USER_AGENT = "gpufleet-client/0.1"

Params = Mapping[str, Any] | Iterable[tuple[str, Any]] | None


@runtime_checkable
class Transport(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = None,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> RawResponse:
        """Send one request and return the whole answer, whatever its status."""

    def stream(
        self, method: str, path: str, params: Params = None, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        """The answer's body line by line (without the newline), as the server flushes it.
        An error status raises ApiError on the first iteration; closing the iterator early
        closes the stream on the server too."""

    async def close(self) -> None: ...


def encode_params(params: Params) -> list[tuple[str, str]]:
    """Query pairs in order; None values are left out and booleans written as Kubernetes reads them."""
    if params is None:
        return []
    pairs = params.items() if isinstance(params, Mapping) else params
    out: list[tuple[str, str]] = []
    for key, value in pairs:
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        out.append((key, str(value)))
    return out


def encode_body(
    json: Any, content: bytes | str | None, headers: Mapping[str, str] | None
) -> tuple[bytes, dict[str, str]]:
    out_headers = lower_keys(headers or {})
    if json is not None:
        if content is not None:
            raise ValueError("pass json or content, not both")
        body = jsoncodec.dumps(json)
        out_headers.setdefault("content-type", "application/json")
    elif content is not None:
        body = content.encode() if isinstance(content, str) else bytes(content)
    else:
        body = b""
    out_headers.setdefault("accept", "application/json")
    return body, out_headers


# Seconds an idle connection to the API server is kept for the next request.
KEEPALIVE_EXPIRY = 60.0


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a stream whatever its chunks: one chunk may hold many lines (a watch sends
    the events it has ready together) or part of one. Each chunk is split once (linear in
    its size, however many lines it holds)."""
    buf = b""
    async for chunk in chunks:
        if not chunk:
            continue
        if b"\n" not in chunk:
            buf += chunk
            continue
        lines = chunk.split(b"\n")
        if buf:
            lines[0] = buf + lines[0]
        buf = lines.pop()
        for line in lines:
            yield line.rstrip(b"\r")
    if buf:
        yield buf.rstrip(b"\r")


def lower_keys(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


class EncodingTransport:
    """``request`` over ``_send``: the body (json or content) and headers encoded once, here,
    for every transport."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = None,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> RawResponse:
        """Send one request and return the whole answer, whatever its status."""
        body, hdrs = encode_body(json, content, headers)
        return await self._send(method, path, params, body, hdrs)

    async def _send(
        self, method: str, path: str, params: Params, body: bytes, hdrs: dict[str, str]
    ) -> RawResponse:  # pragma: no cover - each transport's
        raise NotImplementedError


class LocalTransport(EncodingTransport):
    """Calls an in-process API server's handler directly: no sockets, same semantics.
    ``token`` is sent as a bearer token, as over HTTP, for a server that authenticates."""

    def __init__(self, handler: Handler, *, token: str | None = None) -> None:
        self.handler = handler
        self.token = token

    def _request(
        self,
        method: str,
        path: str,
        params: Params,
        body: bytes,
        headers: dict[str, str],
    ) -> RawRequest:
        query = encode_params(params)
        # A path with its own query string (raw_request("GET", "/x?a=b")) works as over HTTP.
        parts = urlsplit(path)
        if parts.query:
            query = parse_qsl(parts.query, keep_blank_values=True) + query
            path = parts.path
        headers.setdefault("user-agent", USER_AGENT)
        if self.token:
            headers.setdefault("authorization", f"Bearer {self.token}")
        if body:
            headers.setdefault("content-length", str(len(body)))
        return RawRequest(method=method.upper(), path=path, query=query, headers=headers, body=body)

    async def _send(
        self, method: str, path: str, params: Params, body: bytes, hdrs: dict[str, str]
    ) -> RawResponse:
        resp = await self.handler.handle(self._request(method, path, params, body, hdrs))
        out = RawResponse(status=resp.status, headers=lower_keys(resp.headers))
        if resp.stream is not None:
            # A buffered call on a streaming answer (a log without follow served as a stream)
            # reads it to the end, as an HTTP client would.
            chunks = [c async for c in _aclosing_iter(resp.stream)]
            out.body = b"".join(chunks)
        else:
            out.body = bytes(resp.body or b"")
        return out

    async def stream(
        self, method: str, path: str, params: Params = None, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        body, hdrs = encode_body(None, None, headers)
        resp = await self.handler.handle(self._request(method, path, params, body, hdrs))
        resp_headers = lower_keys(resp.headers)
        if resp.status >= 400:
            data = resp.body or b""
            if resp.stream is not None:
                data += b"".join([c async for c in _aclosing_iter(resp.stream)])
            raise error_from_response(resp.status, data, resp_headers)
        if resp.stream is None:
            async for line in _lines(_once(resp.body or b"")):
                yield line
            return
        source = resp.stream
        try:
            async for line in _lines(source):
                yield line
        finally:
            # Closing the server's generator is what ends its watch; without this an
            # abandoned in-process watch would keep its store subscription forever.
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def close(self) -> None:
        return None


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _aclosing_iter(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in source:
            yield chunk
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


def _ssl_context(
    ca_file: str | None,
    ca_data: bytes | str | None,
    insecure: bool,
    client_cert: tuple[str | bytes, str | bytes] | None,
) -> ssl.SSLContext | bool:
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_file or ca_data:
        cadata = ca_data.decode() if isinstance(ca_data, bytes) else ca_data
        ctx = ssl.create_default_context(cafile=ca_file, cadata=cadata)
    else:
        ctx = ssl.create_default_context()
    if client_cert:
        cert, key = client_cert
        _load_cert_chain(ctx, cert, key)
    return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert: str | bytes, key: str | bytes) -> None:
    # ssl only loads a client certificate from files; PEM given as data (a kubeconfig's
    # client-certificate-data) goes through private temporary files removed right after.
    paths: list[str] = []
    try:
        resolved = []
        for item in (cert, key):
            if isinstance(item, bytes):
                fd, path = tempfile.mkstemp(prefix="gpufleet-", suffix=".pem")
                paths.append(path)
                with os.fdopen(fd, "wb") as f:
                    f.write(item)
                resolved.append(path)
            else:
                resolved.append(item)
        ctx.load_cert_chain(resolved[0], resolved[1])
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


class HttpTransport(EncodingTransport):
    """HTTP/1.1 with keep-alive to a real API server (ours or Kubernetes')."""

    def __init__(
        self,
        server_url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        ca_data: bytes | str | None = None,
        insecure: bool = False,
        client_cert: tuple[str | bytes, str | bytes] | None = None,
        timeout: float = 30,
        max_connections: int = 100,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self.timeout = timeout
        headers = {"user-agent": USER_AGENT}
        if token:
            headers["authorization"] = f"Bearer {token}"
        # Plain http: no TLS context at all (verify=True would load the system's CA bundle, 30 ms).
        verify: ssl.SSLContext | bool = False
        if self.server_url.startswith("https:"):
            verify = _ssl_context(ca_file, ca_data, insecure, client_cert)
            use_small_tls_buffers()  # 32 KiB per TLS connection rather than asyncio's 256
        self._headers, self._verify, self._max_connections = headers, verify, max_connections
        self._client = self._pool()
        # Watches and other streams have a pool of their own. httpcore's pool, at every request
        # it starts or finishes, looks at each of its connections (whether an idle one expired:
        # a readability poll through anyio's attribute dict): a scheduler's dozen long watches
        # in the same pool made each binding pay for them, and long-lived streams never leave
        # the short requests' pool idle enough to shrink.
        self._streams: httpx.AsyncClient | None = None

    def _pool(self) -> httpx.AsyncClient:
        max_connections = self._max_connections
        return httpx.AsyncClient(
            base_url=self.server_url,
            headers=self._headers,
            verify=self._verify,
            timeout=httpx.Timeout(self.timeout),
            # Every connection a burst opened is kept for the next one, idle for up to a minute
            # (httpx keeps 20, for 5 s): with fewer, each burst of more than 20 requests (a
            # scheduler binding pods and writing their Events while the API server is busy)
            # closed the rest as they finished and the next burst opened them again, a TLS
            # handshake on both sides each time: 23 a second from a scheduler at 1,000 nodes.
            # Under the API server's 75 s, so the client is the one that closes, never a
            # request racing the server's close (client-go keeps idle connections 90 s).
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=KEEPALIVE_EXPIRY),
            http1=True,
            http2=False,
            # The API server is named by the kubeconfig alone; a stray HTTP(S)_PROXY in the
            # environment must not reroute control-plane traffic (often on loopback).
            trust_env=False,
        )

    async def _send(
        self, method: str, path: str, params: Params, body: bytes, hdrs: dict[str, str]
    ) -> RawResponse:
        try:
            resp = await self._client.request(
                method.upper(), path, params=encode_params(params) or None, content=body or None, headers=hdrs
            )
        except httpx.HTTPError as exc:
            raise TransportError(f"{method.upper()} {self.server_url}{path}: {_describe(exc)}") from exc
        return RawResponse(
            status=resp.status_code,
            headers=lower_keys(resp.headers),
            body=resp.content,
        )

    async def stream(
        self, method: str, path: str, params: Params = None, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        _, hdrs = encode_body(None, None, headers)
        # A watch may be quiet for minutes: only connecting is bounded, never the wait for data.
        timeout = httpx.Timeout(self.timeout, read=None)
        where = f"{method.upper()} {self.server_url}{path}"
        try:
            if self._streams is None:
                self._streams = self._pool()
            async with self._streams.stream(
                method.upper(), path, params=encode_params(params) or None, headers=hdrs, timeout=timeout
            ) as resp:
                if resp.status_code >= 400:
                    data = await resp.aread()
                    raise error_from_response(
                        resp.status_code, data, lower_keys(resp.headers)
                    )
                async for line in _lines(resp.aiter_bytes()):
                    yield line
        except httpx.HTTPError as exc:
            raise TransportError(f"{where}: {_describe(exc)}") from exc

    async def close(self) -> None:
        await self._client.aclose()
        if self._streams is not None:
            await self._streams.aclose()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _never_sent(exc: TransportError) -> bool:
    """Whether the request surely never reached the server (it could not even connect), so
    sending it to another server cannot do it twice."""
    return isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


class FailoverTransport(EncodingTransport):
    """Several API servers sharing one store, tried in turn: a request that cannot connect
    goes to the next server at once; any other transport failure moves later requests to the
    next server but is raised (the server may have acted on it). Streams fail over the same
    way when they cannot open; one cut off midway raises, and the caller's re-watch goes on
    to the next server."""

    def __init__(self, server_urls: Iterable[str], **options: Any) -> None:
        urls = [u.strip() for u in server_urls if u and u.strip()]
        if not urls:
            raise ValueError("FailoverTransport needs at least one server URL")
        self.transports = [HttpTransport(u, **options) for u in urls]
        self._current = 0

    @property
    def server_url(self) -> str:
        return self.transports[self._current].server_url

    def _failed(self, index: int) -> None:
        # Concurrent requests that failed on the same server move on once, not once each.
        if self._current == index:
            self._current = (index + 1) % len(self.transports)

    async def _send(
        self, method: str, path: str, params: Params, body: bytes, hdrs: dict[str, str]
    ) -> RawResponse:
        for attempt in range(len(self.transports)):
            index = self._current
            try:
                return await self.transports[index]._send(method, path, params, body, dict(hdrs))
            except TransportError as exc:
                self._failed(index)
                if not _never_sent(exc) or attempt + 1 == len(self.transports):
                    raise
        raise AssertionError("unreachable")

    async def stream(
        self, method: str, path: str, params: Params = None, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        params = list(encode_params(params))
        for attempt in range(len(self.transports)):
            index = self._current
            opened = False
            try:
                async for line in self.transports[index].stream(method, path, params, headers=headers):
                    opened = True
                    yield line
                return
            except TransportError as exc:
                self._failed(index)
                if opened or not _never_sent(exc) or attempt + 1 == len(self.transports):
                    raise

    async def close(self) -> None:
        for t in self.transports:
            await t.close()
