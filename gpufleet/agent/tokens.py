"""Service account tokens for projected volumes, as the kubelet's token manager keeps them.

Each (service account, audiences, lifetime, pod) gets one token from the TokenRequest API,
kept until 80% of its lifetime has passed or it is older than 24 hours (less a jitter of up
to 10 seconds, so that many pods started together do not all ask at once). A refresh that
fails while the token still holds keeps the old one; only an expired token is an error.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.utils.clock import Clock, parse_rfc3339

log = logging.getLogger(__name__)

# (namespace, service account, TokenRequest body) -> the TokenRequest the API answered.
TokenSource = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]

MAX_TTL = 24 * 3600.0
MAX_JITTER = 10.0
DEFAULT_EXPIRATION = 3600


class TokenError(Exception):
    pass


@dataclass(frozen=True)
class IssuedToken:
    token: str
    # Seconds since the epoch.
    expires_at: float
    # The lifetime the API granted (it may differ from the one asked for).
    expiration_seconds: int | None
    pod_uid: str

    @property
    def issued_at(self) -> float:
        return self.expires_at - (self.expiration_seconds or 0)


def token_request(audiences: Sequence[str], expiration_seconds: int, pod_name: str, pod_uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "expirationSeconds": int(expiration_seconds),
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod_name, "uid": pod_uid},
    }
    if audiences:
        # Left out, the API server issues the token for its own audiences.
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


class TokenManager:
    def __init__(self, source: TokenSource, clock: Clock, rng: random.Random | None = None) -> None:
        self.source = source
        self.clock = clock
        self.rng = rng or random.Random()
        self._cache: dict[str, IssuedToken] = {}

    async def get(self, namespace: str, service_account: str, *, audiences: Sequence[str],
                  expiration_seconds: int, pod_name: str, pod_uid: str) -> IssuedToken:
        key = f'"{service_account}"/"{namespace}"/{list(audiences)}/{int(expiration_seconds)}/{pod_uid}'
        cached = self._cache.get(key)
        if cached is not None and not self.requires_refresh(cached):
            return cached
        body = token_request(audiences, expiration_seconds, pod_name, pod_uid)
        try:
            answer = await self.source(namespace, service_account, body)
            issued = _parse(answer, expiration_seconds, pod_uid)
        except Exception as exc:
            if cached is None:
                raise TokenError(f"failed to fetch token: {exc}") from exc
            if self.expired(cached):
                raise TokenError(f"token {key} expired and refresh failed: {exc}") from exc
            log.warning("refreshing the token %s failed (%s); the current one still holds", key, exc)
            return cached
        self._cache[key] = issued
        return issued

    def requires_refresh(self, token: IssuedToken) -> bool:
        if token.expiration_seconds is None:
            return False
        now = self.clock.now()
        # Whole seconds, as the kubelet truncates its jitter.
        jitter = float(math.floor(self.rng.random() * MAX_JITTER))
        if now > token.issued_at + MAX_TTL - jitter:
            return True
        return now > token.expires_at - (token.expiration_seconds * 20 // 100) - jitter

    def expired(self, token: IssuedToken) -> bool:
        return self.clock.now() > token.expires_at

    def forget_pod(self, pod_uid: str) -> None:
        for key in [k for k, t in self._cache.items() if t.pod_uid == pod_uid]:
            del self._cache[key]

    def cleanup(self) -> None:
        """Drop expired tokens (of pods that went away without a teardown)."""
        for key in [k for k, t in self._cache.items() if self.expired(t)]:
            del self._cache[key]


def _parse(answer: Any, asked_seconds: int, pod_uid: str) -> IssuedToken:
    if not isinstance(answer, dict):
        raise TokenError(f"the TokenRequest answer is a {type(answer).__name__}, not an object")
    status = answer.get("status") or {}
    token = status.get("token")
    stamp = status.get("expirationTimestamp")
    if not token or not stamp:
        raise TokenError("the TokenRequest answer has no status.token or status.expirationTimestamp")
    granted = (answer.get("spec") or {}).get("expirationSeconds")
    return IssuedToken(token=str(token), expires_at=parse_rfc3339(str(stamp)),
                       expiration_seconds=int(granted if granted is not None else asked_seconds),
                       pod_uid=pod_uid)
