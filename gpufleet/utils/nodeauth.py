"""What the API server and a node agent agree on for the agent's port (see
gpufleet/apiserver/auth/nodecreds.py): the name a node's serving certificate is for, and the
short-lived proxy tokens, with the agent's check of them."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import jwt

SERVING_SUFFIX = "nodes.gpufleet.internal"
TOKEN_ISSUER = "gpufleet-apiserver"
TOKEN_ALGORITHM = "ES256"
TOKEN_LIFETIME = 60
# Longest lifetime an agent accepts, and the clock skew it forgives.
MAX_TOKEN_LIFETIME = 300
LEEWAY = 10
# Accepted token ids remembered (until they expire): the most requests a node may get per
# token lifetime before the oldest ids are forgotten and their tokens refused outright.
REPLAY_CACHE_SIZE = 200_000


def serving_name(node: str) -> str:
    """The one name a node's serving certificate is for, and the TLS server name the API
    server asks for when it dials that node."""
    return f"{node}.{SERVING_SUFFIX}"


class ProxyTokenVerifier:
    """The agent's check of a proxy token: signed by the API server's key, for this node,
    not expired (with ``LEEWAY`` of skew), at most ``MAX_TOKEN_LIFETIME`` long, and never seen
    before (its ``jti`` is kept until it expires)."""

    def __init__(self, public_key_pem: bytes, node: str, *, now: Callable[[], float] = time.time) -> None:
        self._key = public_key_pem
        self.node = node
        self._now = now
        self._seen: OrderedDict[str, float] = OrderedDict()  # jti -> exp, oldest first
        self._lock = threading.Lock()

    def verify(self, token: str) -> str | None:
        """None when the token is good (and now spent), else why it is refused."""
        now = self._now()
        try:
            claims = jwt.decode(token, self._key, algorithms=[TOKEN_ALGORITHM], audience=self.node,
                                issuer=TOKEN_ISSUER, leeway=LEEWAY,
                                options={"require": ["exp", "iat", "jti", "aud", "iss"], "verify_iat": False,
                                         "verify_exp": False, "verify_nbf": False})
        except jwt.PyJWTError as exc:
            return f"invalid token: {exc}"
        exp, iat, jti = claims.get("exp"), claims.get("iat"), claims.get("jti")
        if not isinstance(exp, int | float) or not isinstance(iat, int | float) or not isinstance(jti, str):
            return "invalid token claims"
        if exp + LEEWAY < now:
            return "token expired"
        if iat - LEEWAY > now or exp - iat > MAX_TOKEN_LIFETIME:
            return "token issued in the future or for too long"
        with self._lock:
            while self._seen:
                oldest, oldest_exp = next(iter(self._seen.items()))
                if oldest_exp + LEEWAY >= now and len(self._seen) < REPLAY_CACHE_SIZE:
                    break
                self._seen.popitem(last=False)
            if jti in self._seen:
                return "token replayed"
            self._seen[jti] = float(exp)
        return None
