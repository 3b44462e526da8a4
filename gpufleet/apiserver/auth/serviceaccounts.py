"""Service account tokens: the signing key, the TokenRequest API and the token authenticator.

As in Kubernetes (pkg/serviceaccount, pkg/registry/core/serviceaccount/storage/token.go):

* Keys. The control plane signs with one private key (``--service-account-signing-key-file``,
  by default <state-dir>/pki/sa.key, an RSA 2048 key made once with pki/sa.pub beside it) and
  accepts tokens signed by any public key of ``--service-account-key-file`` (PEM files of
  public keys, private keys or certificates) and its own. RSA keys sign RS256, ECDSA keys
  ES256/ES384/ES512 by curve; the JWS header's ``kid`` is the unpadded base64url SHA-256 of
  the public key's DER, as kube-apiserver computes it. Several servers on one store must
  share the key, as they share the CA.
* Tokens are JWTs with Kubernetes' claims: iss (the first ``--service-account-issuer``), sub
  ``system:serviceaccount:<ns>:<name>``, aud, exp, iat, nbf, jti, and ``kubernetes.io`` with
  namespace, serviceaccount {name, uid}, pod {name, uid} or secret {name, uid} when bound,
  node {name, uid} for a pod on a node, and warnafter for an extended pod token.
* TokenRequest: ``POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token``, authorized as
  ``create`` on ``serviceaccounts/token``. Audiences default to the API server's
  (``--api-audiences``, by default the issuers), expirationSeconds to 3600 (at least 600). A
  boundObjectRef names a Pod (which must run as this service account) or a Secret of the
  namespace, or a Node; its uid, when given, must match. A pod-bound request for exactly 3607 seconds
  with the API audiences (what a projected volume asks for) gets a token valid for a year
  whose warnafter is the 3607 seconds, so a client that does not re-read its token keeps
  working (``--service-account-extend-token-expiration``); status.expirationTimestamp shows
  the time asked for.
* Authentication: a token of one of the issuers is accepted when its signature verifies with
  one of the keys, exp and nbf hold (with a minute of leeway, as go-jose's), one of its
  audiences is the API server's, the service account still exists with the uid of the claim,
  and the bound pod, secret or node still exists with its uid. An object being deleted invalidates
  the token only once its deletionTimestamp (for a pod, the end of its grace period) is more
  than the leeway in the past, as Kubernetes does, so a terminating pod can still talk to the
  API while it shuts down. The user is ``system:serviceaccount:<ns>:<name>`` with the service
  account's uid, the groups ``system:serviceaccounts`` and ``system:serviceaccounts:<ns>``
  (and ``system:authenticated``), and the extras Kubernetes sets:
  ``authentication.kubernetes.io/pod-name``, ``pod-uid``, ``node-name``, ``node-uid`` and
  ``credential-id`` (``JTI=<jti>``).

The key files (loading, writing, key ids and algorithms) are in serviceaccountkeys.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jwt

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.serviceaccountkeys import (
    KeyFileError,
    PrivateKey,
    PublicKey,
    algorithm,
    ensure_service_account_key,
    key_id,
    load_public_keys,
    load_signing_key,
    public_pem,
)
from gpufleet.apiserver.auth.tokens import AUTHENTICATED_GROUP
from gpufleet.apiserver.errors import ApiException, bad_request, not_found
from gpufleet.store import base as store_base
from gpufleet.utils.clock import REAL_CLOCK, Clock, parse_rfc3339, rfc3339

if TYPE_CHECKING:
    from gpufleet.api.registry import ResourceType
    from gpufleet.apiserver.server import ApiServer

# Re-exported: callers import the key helpers from here.
__all__ = [
    "KeyFileError",
    "PrivateKey",
    "PublicKey",
    "algorithm",
    "ensure_service_account_key",
    "key_id",
    "load_public_keys",
    "load_signing_key",
    "public_pem",
]

log = logging.getLogger("gpufleet.apiserver.auth")

DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
AUTHN_GROUP = "authentication.k8s.io"
DEFAULT_EXPIRATION_SECONDS = 3600
MIN_EXPIRATION_SECONDS = 600
MAX_EXPIRATION_SECONDS = 1 << 32
# What a projected volume's token asks for (the admission plugin writes it), and how long
# such a token really lives (Kubernetes' WarnOnlyBoundTokenExpirationSeconds and
# ExpirationExtensionSeconds).
WARN_ONLY_EXPIRATION_SECONDS = 3607
EXTENDED_EXPIRATION_SECONDS = 365 * 24 * 3600
# go-jose's jwt.DefaultLeeway, which Kubernetes' validator uses for times and deletions.
LEEWAY_SECONDS = 60

POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
NODE_UID_KEY = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"


def username(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def group_names(namespace: str) -> list[str]:
    return [SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}"]


# ------------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Ref:
    name: str
    uid: str = ""

    def claim(self) -> dict[str, str]:
        return {"name": self.name, **({"uid": self.uid} if self.uid else {})}


def token_claims(*, issuer: str, namespace: str, service_account: Ref, audiences: Sequence[str], now: float,
                 expiration_seconds: int, pod: Ref | None = None, secret: Ref | None = None,
                 node: Ref | None = None, warn_after_seconds: int = 0, jti: str = "") -> dict[str, Any]:
    """The claims of a token, as Kubernetes' serviceaccount.Claims writes them."""
    issued = int(now)
    private: dict[str, Any] = {"namespace": namespace, "serviceaccount": service_account.claim()}
    if pod is not None:
        private["pod"] = pod.claim()
        if node is not None:
            private["node"] = node.claim()
    elif secret is not None:
        private["secret"] = secret.claim()
    elif node is not None:
        private["node"] = node.claim()
    if warn_after_seconds:
        private["warnafter"] = issued + warn_after_seconds
    claims: dict[str, Any] = {
        "aud": list(audiences),
        "exp": issued + expiration_seconds,
        "iat": issued,
        "iss": issuer,
        **({"jti": jti} if jti else {}),
        "kubernetes.io": private,
        "nbf": issued,
        "sub": username(namespace, service_account.name),
    }
    return claims


class TokenSigner:
    def __init__(self, key: PrivateKey, issuer: str) -> None:
        self.key = key
        self.issuer = issuer
        self.algorithm = algorithm(key)
        self.key_id = key_id(key.public_key())

    def sign(self, claims: dict[str, Any]) -> str:
        # No "typ" header: kube-apiserver's tokens carry only alg and kid.
        return jwt.encode(claims, self.key, algorithm=self.algorithm, headers={"kid": self.key_id, "typ": None})


class InvalidToken(Exception):
    """Why a service account token was refused (logged; the client sees only 401)."""


@dataclass(frozen=True)
class VerifiedToken:
    namespace: str
    service_account: Ref
    pod: Ref | None
    secret: Ref | None
    node: Ref | None
    jti: str


def _ref(value: Any, what: str) -> Ref | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise InvalidToken(f"the {what} claim is malformed")
    uid = value.get("uid") or ""
    if not isinstance(uid, str):
        raise InvalidToken(f"the {what} claim is malformed")
    return Ref(value["name"], uid)


def issuer_of(token: str) -> str | None:
    """The unverified iss of a JWT, or None when ``token`` is not a JWT: the cheap test of
    whether a bearer token is for this authenticator at all."""
    if token.count(".") != 2:
        return None
    try:
        iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        return None
    return iss if isinstance(iss, str) else None


def verify_token(token: str, keys: Sequence[PublicKey], issuers: Sequence[str], audiences: Sequence[str],
                 now: float) -> VerifiedToken:
    """The token's claims once its signature, issuer, times and audience hold (no store
    reads: the caller checks that the objects it names still exist). Raises InvalidToken."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as e:
        raise InvalidToken(f"malformed token: {e}") from None
    kid = header.get("kid")
    # A key named by the header first, then every other: kube-apiserver tries them all.
    ordered = sorted(keys, key=lambda k: kid is None or key_id(k) != kid)
    claims: dict[str, Any] | None = None
    for key in ordered:
        try:
            claims = jwt.decode(token, key, algorithms=[algorithm(key)],
                                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                                         "verify_aud": False, "verify_iss": False})
            break
        except jwt.InvalidSignatureError:
            continue
        except jwt.InvalidAlgorithmError:
            continue
        except jwt.PyJWTError as e:
            raise InvalidToken(f"malformed token: {e}") from None
    if claims is None:
        raise InvalidToken("invalid signature")
    if claims.get("iss") not in issuers:
        raise InvalidToken(f"the token's issuer {claims.get('iss')!r} is not one of {list(issuers)}")
    for name in ("exp", "nbf", "iat"):
        if name in claims and not isinstance(claims[name], int | float):
            raise InvalidToken(f"the {name} claim is not a number")
    if "exp" not in claims:
        raise InvalidToken("the token has no expiry")
    if claims["exp"] < now - LEEWAY_SECONDS:
        raise InvalidToken("service account token has expired")
    if "nbf" in claims and claims["nbf"] > now + LEEWAY_SECONDS:
        raise InvalidToken("service account token is not valid yet")
    if "iat" in claims and claims["iat"] > now + LEEWAY_SECONDS:
        raise InvalidToken("service account token is issued in the future")
    aud = claims.get("aud")
    token_audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if not any(a in audiences for a in token_audiences):
        raise InvalidToken("token audiences is invalid")
    private = claims.get("kubernetes.io")
    if not isinstance(private, dict):
        raise InvalidToken("the token has no kubernetes.io claim")
    namespace = private.get("namespace")
    sa = _ref(private.get("serviceaccount"), "serviceaccount")
    if not isinstance(namespace, str) or not namespace or sa is None:
        raise InvalidToken("the token names no service account")
    if claims.get("sub") != username(namespace, sa.name):
        raise InvalidToken("the subject does not match the service account claim")
    jti = claims.get("jti") or ""
    return VerifiedToken(namespace=namespace, service_account=sa, pod=_ref(private.get("pod"), "pod"),
                         secret=_ref(private.get("secret"), "secret"), node=_ref(private.get("node"), "node"),
                         jti=jti if isinstance(jti, str) else "")


def _deleted_before(obj: dict[str, Any], deadline: float) -> bool:
    stamp = (obj.get("metadata") or {}).get("deletionTimestamp")
    return bool(stamp) and parse_rfc3339(stamp) < deadline


class ServiceAccountAuthenticator:
    """The user a service account token names, checked against the store on each request
    (three keyed reads at most), so deleting the service account or the pod revokes it."""

    def __init__(self, store: store_base.Store, keys: Sequence[PublicKey], issuers: Sequence[str],
                 audiences: Sequence[str], *, clock: Clock = REAL_CLOCK) -> None:
        if not issuers:
            raise ValueError("at least one service account issuer is needed")
        self.store = store
        self.keys = list(keys)
        self.issuers = list(issuers)
        self.audiences = list(audiences)
        self.clock = clock

    def handles(self, token: str) -> bool:
        return issuer_of(token) in self.issuers

    async def authenticate(self, token: str) -> UserInfo | None:
        if not self.handles(token):
            return None
        try:
            return await self._authenticate(token)
        except InvalidToken as e:
            log.info("service account token refused: %s", e)
            return None

    async def _authenticate(self, token: str) -> UserInfo:
        now = self.clock.now()
        claims = verify_token(token, self.keys, self.issuers, self.audiences, now)
        deadline = now - LEEWAY_SECONDS
        ns, sa_ref = claims.namespace, claims.service_account
        sa = await self._get("serviceaccounts", ns, sa_ref.name)
        if sa is None:
            raise InvalidToken(f"service account {ns}/{sa_ref.name} has been deleted")
        sa_uid = (sa.get("metadata") or {}).get("uid", "")
        if sa_uid != sa_ref.uid:
            raise InvalidToken(f"service account UID ({sa_uid}) does not match claim ({sa_ref.uid})")
        if _deleted_before(sa, deadline):
            raise InvalidToken("service account has been deleted")
        extra: dict[str, list[str]] = {}
        for resource, ref in (("secrets", claims.secret), ("pods", claims.pod)):
            if ref is None:
                continue
            what = resource[:-1]
            obj = await self._get(resource, ns, ref.name)
            if obj is None:
                raise InvalidToken(f"{what} {ns}/{ref.name} has been deleted")
            uid = (obj.get("metadata") or {}).get("uid", "")
            if uid != ref.uid:
                raise InvalidToken(f"{what} UID ({uid}) does not match claim ({ref.uid})")
            if _deleted_before(obj, deadline):
                raise InvalidToken(f"{what} has been deleted")
        if claims.node is not None and claims.pod is None and claims.secret is None:
            # A token bound to a node itself lives as long as that node.
            node = await self._get("nodes", "", claims.node.name)
            if node is None:
                raise InvalidToken(f"node {claims.node.name} has been deleted")
            uid = (node.get("metadata") or {}).get("uid", "")
            if uid != claims.node.uid:
                raise InvalidToken(f"node UID ({uid}) does not match claim ({claims.node.uid})")
            if _deleted_before(node, deadline):
                raise InvalidToken("node has been deleted")
        if claims.pod is not None:
            extra[POD_NAME_KEY] = [claims.pod.name]
            extra[POD_UID_KEY] = [claims.pod.uid]
        if claims.node is not None and claims.secret is None:
            extra[NODE_NAME_KEY] = [claims.node.name]
            if claims.node.uid:
                extra[NODE_UID_KEY] = [claims.node.uid]
        if claims.jti:
            extra[CREDENTIAL_ID_KEY] = [f"JTI={claims.jti}"]
        return UserInfo(name=username(ns, sa_ref.name), groups=[*group_names(ns), AUTHENTICATED_GROUP],
                        uid=sa_uid, extra=extra)

    async def _get(self, resource: str, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.store.get(resource, ns, name)
        except store_base.NotFound:
            return None


# ---------------------------------------------------------------------------- TokenRequest


def _invalid(name: str, field_path: str, value: Any, message: str) -> ApiException:
    shown = f'"{value}"' if isinstance(value, str) else value
    cause = {"reason": "FieldValueInvalid", "field": field_path, "message": f"Invalid value: {shown}: {message}"}
    return ApiException(422, "Invalid", f'TokenRequest.{AUTHN_GROUP} "{name}" is invalid: {field_path}: '
                                        f"Invalid value: {shown}: {message}",
                        {"name": name, "group": AUTHN_GROUP, "kind": "TokenRequest", "causes": [cause]})


def _group_version_kind(api_version: str, kind: str) -> tuple[str, str]:
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return group, kind


def _typed(body: Any) -> dict[str, Any]:
    """The request's TokenRequest, shape-checked (a 400 names the field)."""
    from pydantic import ValidationError

    from gpufleet.api import k8s

    if not isinstance(body, dict):
        raise bad_request("the body of a token request must be a TokenRequest object")
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind not in (None, "", "TokenRequest") or api_version not in (None, "", f"{AUTHN_GROUP}/v1"):
        raise bad_request(f"the body must be a TokenRequest of {AUTHN_GROUP}/v1, not {kind} of {api_version}")
    try:
        model = k8s.TokenRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise bad_request(f"the TokenRequest could not be decoded: {where}: {err['msg']}") from None
    return model.model_dump(by_alias=True, exclude_none=True)


@dataclass
class TokenIssuer:
    """Serves the token subresource of ServiceAccounts for one ApiServer."""

    signer: TokenSigner
    audiences: list[str]
    clock: Clock = REAL_CLOCK
    # --service-account-extend-token-expiration and --service-account-max-token-expiration
    # (0: no maximum).
    extend_expiration: bool = True
    max_expiration_seconds: int = 0

    async def create(self, api: ApiServer, rt: ResourceType, ns: str, name: str, body: Any, user: UserInfo,
                     dry_run: bool = False) -> tuple[dict[str, Any], list[str]]:
        """(the answered TokenRequest, warnings)."""
        req = _typed(body)
        meta = dict(req.get("metadata") or {})
        if meta.get("name") and meta["name"] != name:
            raise _invalid(name, "metadata.name", meta["name"], "must match the service account name if specified")
        if meta.get("namespace") and meta["namespace"] != ns:
            raise _invalid(name, "metadata.namespace", meta["namespace"],
                           "must match the service account namespace if specified")
        sa = await api.get_object(rt, ns, name)
        sa_meta = sa.get("metadata") or {}
        spec = dict(req.get("spec") or {})
        audiences = list(spec.get("audiences") or []) or list(self.audiences)
        expiration = spec.get("expirationSeconds")
        expiration = DEFAULT_EXPIRATION_SECONDS if expiration is None else int(expiration)
        now = self.clock.now()
        out_meta = {"name": sa_meta.get("name", name), "namespace": ns, "uid": sa_meta.get("uid", ""),
                    "creationTimestamp": rfc3339(now)}
        if expiration < MIN_EXPIRATION_SECONDS:
            raise _invalid("", "spec.expirationSeconds", expiration, "may not specify a duration less than 10 minutes")
        if expiration > MAX_EXPIRATION_SECONDS:
            raise _invalid("", "spec.expirationSeconds", expiration, "may not specify a duration larger than 2^32 seconds")
        ref = spec.get("boundObjectRef")
        spec_out = {"audiences": audiences, "expirationSeconds": expiration, "boundObjectRef": ref or None}
        request = {"apiVersion": f"{AUTHN_GROUP}/v1", "kind": "TokenRequest", "metadata": out_meta, "spec": spec_out}
        # Validating admission sees the request (NodeRestriction narrows what a node may ask).
        await api.admit("CREATE", rt, ns, name, "token", request, None, user, dry_run, mutate=False)
        pod = secret = node = None
        if ref:
            pod, secret, node = await self._bound(api, ns, name, ref)
        warnings: list[str] = []
        if self.max_expiration_seconds > 0 and expiration > self.max_expiration_seconds:
            warnings.append(f"requested expiration of {expiration} seconds shortened to "
                            f"{self.max_expiration_seconds} seconds")
            expiration = self.max_expiration_seconds
            spec_out["expirationSeconds"] = expiration
        lifetime, warn_after = expiration, 0
        if (self.extend_expiration and pod is not None and expiration == WARN_ONLY_EXPIRATION_SECONDS
                and all(a in self.audiences for a in audiences)):
            lifetime, warn_after = EXTENDED_EXPIRATION_SECONDS, expiration
        claims = token_claims(issuer=self.signer.issuer, namespace=ns,
                              service_account=Ref(out_meta["name"], out_meta["uid"]), audiences=audiences,
                              now=now, expiration_seconds=lifetime, pod=pod, secret=secret, node=node,
                              warn_after_seconds=warn_after, jti=str(uuid.uuid4()))
        token = self.signer.sign(claims)
        request["status"] = {"token": token, "expirationTimestamp": rfc3339(int(now) + expiration)}
        return request, warnings

    async def _bound(self, api: ApiServer, ns: str, name: str,
                     ref: dict[str, Any]) -> tuple[Ref | None, Ref | None, Ref | None]:
        group, kind = _group_version_kind(ref.get("apiVersion") or "", ref.get("kind") or "")
        ref_name = ref.get("name") or ""
        pod = secret = node = None
        if group == "" and kind == "Pod":
            obj = await self._get(api, "pods", ns, ref_name)
            if (obj.get("spec") or {}).get("serviceAccountName") != name:
                raise bad_request(f'cannot bind token for serviceaccount "{name}" to pod running with different '
                                  "serviceaccount name.")
            uid = obj["metadata"].get("uid", "")
            pod = Ref(ref_name, uid)
            node_name = (obj.get("spec") or {}).get("nodeName")
            if node_name:
                try:
                    node_obj = await api.store.get("nodes", "", node_name)
                    node = Ref(node_name, (node_obj.get("metadata") or {}).get("uid", ""))
                except store_base.NotFound:
                    # As Kubernetes: the node's name alone still says where the pod runs.
                    node = Ref(node_name)
        elif group == "" and kind == "Secret":
            obj = await self._get(api, "secrets", ns, ref_name)
            uid = obj["metadata"].get("uid", "")
            secret = Ref(ref_name, uid)
        elif group == "" and kind == "Node":
            obj = await self._get(api, "nodes", "", ref_name)
            uid = obj["metadata"].get("uid", "")
            node = Ref(ref_name, uid)
        else:
            gvk = f"{group}/{ref.get('apiVersion', '').rpartition('/')[2]}, Kind={kind}"
            raise bad_request(f"cannot bind token to object of type {gvk}")
        if ref.get("uid") and ref["uid"] != uid:
            raise ApiException(
                409, "Conflict",
                f'Operation cannot be fulfilled on {kind} "{ref_name}": the UID in the bound object reference '
                f"({ref['uid']}) does not match the UID in record. The object might have been deleted and then "
                "recreated", {"name": ref_name, "kind": kind})
        return pod, secret, node

    @staticmethod
    async def _get(api: ApiServer, resource: str, ns: str, name: str) -> dict[str, Any]:
        rt = api.registry.by_key(resource)
        assert rt is not None
        try:
            return await api.store.get(resource, ns, name)
        except store_base.NotFound:
            raise not_found(rt, name) from None


def verification_keys(signing_key: PrivateKey, key_files: Iterable[Path]) -> list[PublicKey]:
    """The keys tokens are checked with: those of the key files and the signing key's own."""
    keys: list[PublicKey] = []
    seen: set[str] = set()
    for key in [signing_key.public_key(), *(k for p in key_files for k in load_public_keys(p))]:
        kid = key_id(key)
        if kid not in seen:
            seen.add(kid)
            keys.append(key)
    return keys


@dataclass
class ServiceAccountTokens:
    """What the API server signs and accepts service account tokens with (the
    --service-account-* and --api-audiences flags, resolved)."""

    signer: TokenSigner
    keys: list[PublicKey]
    issuers: list[str]
    audiences: list[str]
    extend_expiration: bool = True
    max_expiration_seconds: int = 0

    @classmethod
    def from_files(cls, signing_key_file: Path, key_files: Sequence[Path] = (), issuers: Sequence[str] = (),
                   audiences: Sequence[str] = (), **options: Any) -> ServiceAccountTokens:
        """Raises KeyFileError naming the file when a key cannot be read."""
        issuers = list(dict.fromkeys(issuers)) or [DEFAULT_ISSUER]
        key = load_signing_key(signing_key_file)
        algorithm(key)  # an unsupported curve is refused at start, not at the first token
        return cls(signer=TokenSigner(key, issuers[0]), keys=verification_keys(key, key_files),
                   issuers=issuers, audiences=list(dict.fromkeys(audiences)) or list(issuers), **options)

    def authenticator(self, store: store_base.Store, clock: Clock = REAL_CLOCK) -> ServiceAccountAuthenticator:
        return ServiceAccountAuthenticator(store, self.keys, self.issuers, self.audiences, clock=clock)

    def issuer(self, clock: Clock = REAL_CLOCK) -> TokenIssuer:
        return TokenIssuer(self.signer, list(self.audiences), clock=clock, extend_expiration=self.extend_expiration,
                           max_expiration_seconds=self.max_expiration_seconds)
