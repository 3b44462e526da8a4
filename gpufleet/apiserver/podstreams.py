"""pods/exec, pods/attach and pods/portforward: what kube-apiserver checks before it upgrades
the connection, which protocol the client gets, and the stream to the pod's node agent.

The client speaks one of:

- WebSocket (a GET): ``v5.channel.k8s.io``, ``v4.channel.k8s.io``, ``channel.k8s.io`` or
  ``base64.channel.k8s.io`` for exec and attach (kubectl 1.30+, the Python client); for
  port-forward ``v4.channel.k8s.io`` (the Python client: two channels a port, each opened
  with the port's number) or ``SPDY/3.1+portforward.k8s.io`` (kubectl 1.31+: SPDY carried
  in the WebSocket's binary messages);
- SPDY/3.1 (``Upgrade: SPDY/3.1``, a POST): ``v5`` to ``v1`` ``channel.k8s.io`` (exec,
  attach) or ``portforward.k8s.io``, as kubectl 1.27 and the fallback of newer ones.

Whatever the client speaks, the API server talks to the agent in one protocol: a WebSocket
to the agent's authenticated port with the v5 channel framing (streamrelay.py translates).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from gpufleet.apiserver.errors import ApiException, bad_request
from gpufleet.apiserver.streamrelay import (
    AgentDialer,
    ExecOptions,
    spdy_exec,
    spdy_portforward,
    tunnel_portforward,
    ws_exec,
    ws_portforward,
)
from gpufleet.utils.http import RawRequest, RawResponse, Upgrade

# In the order this server prefers them, for a client that offers several.
EXEC_WEBSOCKET = ("v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io", "base64.channel.k8s.io")
EXEC_SPDY = ("v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io",
             "channel.k8s.io")
PORTFORWARD_WEBSOCKET = ("SPDY/3.1+portforward.k8s.io", "v4.channel.k8s.io")
PORTFORWARD_SPDY = ("portforward.k8s.io",)


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")


def _offered(header: str) -> list[str]:
    return [p.strip() for p in header.split(",") if p.strip()]


def _negotiate(offered: list[str], supported: tuple[str, ...]) -> str | None:
    """The client's first offer this server speaks (kube's httpstream.Handshake)."""
    return next((p for p in offered if p in supported), None)


def _container(pod: dict[str, Any], wanted: str | None, what: str) -> str:
    """The container a stream is for: the one named (it must be the pod's), else the only one."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name", "")
    containers = [c.get("name", "") for c in spec.get("containers") or []]
    inits = [c.get("name", "") for c in spec.get("initContainers") or []]
    ephemeral = [c.get("name", "") for c in spec.get("ephemeralContainers") or []]
    if not wanted:
        if len(containers) == 1:
            return containers[0]
        more = f" or one of the init containers: [{' '.join(inits)}]" if inits else ""
        raise bad_request(f"a container name must be specified for pod {name}, choose one of: "
                          f"[{' '.join(containers)}]{more}")
    if wanted not in [*containers, *inits, *ephemeral]:
        raise bad_request(f"container {wanted} is not valid for pod {name}")
    return wanted


def _ports(req: RawRequest) -> list[int]:
    """?ports=80,8080 (the parameter may repeat), each 1-65535."""
    out: list[int] = []
    for key, value in req.query:
        if key != "ports":
            continue
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or not 0 < int(part) < 65536:
                raise bad_request(f'ports: Invalid value: "{part}": port must be between 1 and 65535, inclusive')
            out.append(int(part))
    return out


class PodStreams:
    """``open`` answers a pods/{exec,attach,portforward} request: a 101 whose ``Upgrade``
    relays the client's protocol to the agent of the pod's node, or a Status saying why not."""

    def __init__(self, node_proxy: Any) -> None:
        self.nodes = node_proxy

    async def open(self, what: str, pod: dict[str, Any], req: RawRequest) -> RawResponse:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        name, ns = meta.get("name", ""), meta.get("namespace", "")
        websocket = "websocket" in req.upgrades and req.headers.get("upgrade", "").lower() == "websocket"
        spdy = ("spdy" in req.upgrades and req.headers.get("upgrade", "").lower().startswith("spdy/3.1"))
        if not websocket and not spdy:
            raise bad_request("Upgrade request required")
        if what == "portforward":
            ports = _ports(req)
            container = ""
        else:
            container = _container(pod, req.param("container"), what)
            opts = ExecOptions(
                stdin=_truthy(req.param("stdin")), stdout=_truthy(req.param("stdout")),
                stderr=_truthy(req.param("stderr")), tty=_truthy(req.param("tty")),
                command=[v for k, v in req.query if k == "command"])
            if opts.tty:
                opts.stderr = False  # a terminal has one output (kubelet's rule)
            if what == "exec" and not opts.command:
                raise bad_request("you must specify at least 1 command")
            if not (opts.stdin or opts.stdout or opts.stderr):
                raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        node_name = spec.get("nodeName") or ""
        if not node_name:
            raise bad_request(f"pod {name} does not have a host assigned")
        phase = (pod.get("status") or {}).get("phase")
        if what != "portforward" and phase in ("Succeeded", "Failed"):
            raise bad_request(f"cannot {what} into a container in a completed pod; current phase is {phase}")
        base, headers, tls, sni = await self.nodes.agent_dial(node_name)
        if base is None:
            raise ApiException(503, "ServiceUnavailable",
                               f"node {node_name} publishes no agent endpoint to {what} pod {name} through")
        ws_base = "wss" + base[len("https"):] if base.startswith("https") else "ws" + base[len("http"):]

        def dialer(path: str, query: list[tuple[str, str]]) -> AgentDialer:
            # A fresh token a dial: the agent accepts each proxy token once.
            url = f"{ws_base}{path}?{urlencode(query)}" if query else f"{ws_base}{path}"
            return AgentDialer(url, lambda: self.nodes.node_headers(node_name), tls, sni)

        if what == "portforward":
            def agent_for(port: int) -> AgentDialer:
                return dialer(f"/portforward/{quote(ns)}/{quote(name)}", [("port", str(port))])

            where = f"pod {name}"
            if websocket:
                proto = _negotiate(_offered(req.headers.get("sec-websocket-protocol", "")) or
                                   ["v4.channel.k8s.io"], PORTFORWARD_WEBSOCKET)
                if proto is None:
                    raise bad_request(self._unsupported(req.headers.get("sec-websocket-protocol", ""),
                                                        PORTFORWARD_WEBSOCKET))
                if proto.startswith("SPDY/3.1"):
                    return self._ws(proto, lambda ch: tunnel_portforward(ch, agent_for, where))
                if not ports:
                    raise bad_request("query parameter \"port\" is required")
                return self._ws(proto, lambda ch: ws_portforward(ch, agent_for, ports, where))
            proto = self._spdy_protocol(req, PORTFORWARD_SPDY)
            return self._spdy(proto, lambda conn: spdy_portforward(conn, agent_for, where))

        query = [*(("command", c) for c in opts.command), ("stdin", str(opts.stdin).lower()),
                 ("stdout", str(opts.stdout).lower()), ("stderr", str(opts.stderr).lower()),
                 ("tty", str(opts.tty).lower())]
        agent = dialer(f"/{what}/{quote(ns)}/{quote(name)}/{quote(container)}", query)
        if websocket:
            offered = _offered(req.headers.get("sec-websocket-protocol", ""))
            proto = _negotiate(offered or ["channel.k8s.io"], EXEC_WEBSOCKET)
            if proto is None:
                raise bad_request(self._unsupported(req.headers.get("sec-websocket-protocol", ""), EXEC_WEBSOCKET))
            return self._ws(proto, lambda ch: ws_exec(ch, agent, proto, opts))
        proto = self._spdy_protocol(req, EXEC_SPDY)
        return self._spdy(proto, lambda conn: spdy_exec(conn, agent, proto, opts))

    @staticmethod
    def _unsupported(offered: str, supported: tuple[str, ...]) -> str:
        return (f"unable to upgrade: unable to negotiate protocol: client supports [{offered}], "
                f"server accepts [{', '.join(supported)}]")

    def _spdy_protocol(self, req: RawRequest, supported: tuple[str, ...]) -> str:
        offered = _offered(req.headers.get("x-stream-protocol-version", ""))
        proto = _negotiate(offered, supported)
        if proto is None:
            raise bad_request(self._unsupported(", ".join(offered), supported))
        return proto

    @staticmethod
    def _ws(proto: str, run: Callable[[Any], Awaitable[None]]) -> RawResponse:
        return RawResponse(101, {}, upgrade=Upgrade("websocket", run, subprotocol=proto))

    @staticmethod
    def _spdy(proto: str, run: Callable[[Any], Awaitable[None]]) -> RawResponse:
        headers = {"connection": "Upgrade", "upgrade": "SPDY/3.1", "x-stream-protocol-version": proto}
        return RawResponse(101, {}, upgrade=Upgrade("spdy", run, headers=headers))
