"""A tenant's flood, run as its own process so its CPU is not the measuring side's:
``--concurrency`` workers listing config maps with one token, without pause and without
honouring Retry-After, and ``--big-bodies`` senders posting ``--big-size`` byte ConfigMaps
(half with the token, half without), all for ``--seconds``. Prints one JSON line: the
answers' status codes counted, per kind of request.

    python flood_client.py --url https://127.0.0.1:6443 --token T --ca ca.crt --namespace team-a
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import ssl
import time

import httpx


def big_configmap(size: int) -> bytes:
    """A ConfigMap of about ``size`` bytes made of labels, as the issue's 2-million-label one."""
    head = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"huge","labels":{'
    entry_len = len(b'"k0000000":"v",')
    n = max(1, (size - len(head) - 3) // entry_len)
    labels = b",".join(b'"k%07d":"v"' % i for i in range(n))
    return head + labels + b"}}}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--namespace", default="team-a")
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--big-bodies", type=int, default=4)
    ap.add_argument("--big-size", type=int, default=31 * 1000 * 1000)
    args = ap.parse_args()
    ctx = ssl.create_default_context(cafile=args.ca)
    limits = httpx.Limits(max_connections=args.concurrency + args.big_bodies, max_keepalive_connections=None)
    counts: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    errors: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    deadline = time.monotonic() + args.seconds
    body = big_configmap(args.big_size) if args.big_bodies else b""
    auth = {"authorization": f"Bearer {args.token}"}
    async with httpx.AsyncClient(base_url=args.url, verify=ctx, limits=limits, timeout=60) as client:
        async def lister() -> None:
            while time.monotonic() < deadline:
                try:
                    r = await client.get(f"/api/v1/namespaces/{args.namespace}/configmaps", headers=auth)
                    counts["list"][r.status_code] += 1
                except httpx.HTTPError as e:
                    errors["list"][type(e).__name__] += 1

        async def big(i: int) -> None:
            headers = {"content-type": "application/json", **(auth if i % 2 == 0 else {})}
            kind = "big-authenticated" if i % 2 == 0 else "big-unauthenticated"
            while time.monotonic() < deadline:
                try:
                    r = await client.post(f"/api/v1/namespaces/{args.namespace}/configmaps", content=body,
                                          headers=headers)
                    counts[kind][r.status_code] += 1
                except httpx.HTTPError as e:
                    # A sender without a token is cut off: the server does not read its body.
                    errors[kind][type(e).__name__] += 1

        await asyncio.gather(*[lister() for _ in range(args.concurrency)],
                             *[big(i) for i in range(args.big_bodies)])
    print(json.dumps({"counts": {k: dict(v) for k, v in counts.items()}, "errors": {k: dict(v) for k, v in errors.items()}}))


if __name__ == "__main__":
    asyncio.run(main())
