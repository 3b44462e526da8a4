"""Service account tokens, signing and checking: the claims Kubernetes writes, the key files
kube-apiserver reads, and every reason a token is refused (expired, not yet valid, another
audience, another key or issuer, its service account or pod gone or replaced)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gpufleet.apiserver.auth.certs import make_ca
from gpufleet.apiserver.auth.serviceaccounts import (
    CREDENTIAL_ID_KEY,
    DEFAULT_ISSUER,
    NODE_NAME_KEY,
    NODE_UID_KEY,
    POD_NAME_KEY,
    POD_UID_KEY,
    InvalidToken,
    KeyFileError,
    Ref,
    ServiceAccountAuthenticator,
    ServiceAccountTokens,
    TokenSigner,
    ensure_service_account_key,
    key_id,
    load_public_keys,
    load_signing_key,
    token_claims,
    verify_token,
)
from gpufleet.store.base import open_store
from gpufleet.utils.clock import FakeClock, rfc3339

NOW = 1_800_000_000.0
AUD = [DEFAULT_ISSUER]


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa_key()


def claims(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(issuer=DEFAULT_ISSUER, namespace="team", service_account=Ref("bot", "sa-uid"),
                                audiences=AUD, now=NOW, expiration_seconds=3600, jti="j-1")
    args.update(overrides)
    return token_claims(**args)


def test_claims_are_kubernetes_claims() -> None:
    c = claims(pod=Ref("p", "pod-uid"), node=Ref("n1", "node-uid"), warn_after_seconds=3607,
               expiration_seconds=365 * 24 * 3600)
    assert c == {
        "aud": AUD, "exp": int(NOW) + 365 * 24 * 3600, "iat": int(NOW), "nbf": int(NOW), "iss": DEFAULT_ISSUER,
        "jti": "j-1", "sub": "system:serviceaccount:team:bot",
        "kubernetes.io": {"namespace": "team", "serviceaccount": {"name": "bot", "uid": "sa-uid"},
                          "pod": {"name": "p", "uid": "pod-uid"}, "node": {"name": "n1", "uid": "node-uid"},
                          "warnafter": int(NOW) + 3607},
    }
    secret_bound = claims(secret=Ref("s", "s-uid"))["kubernetes.io"]
    assert secret_bound == {"namespace": "team", "serviceaccount": {"name": "bot", "uid": "sa-uid"},
                            "secret": {"name": "s", "uid": "s-uid"}}


def test_signed_token_has_kube_apiservers_header_and_verifies(key: rsa.RSAPrivateKey) -> None:
    token = TokenSigner(key, DEFAULT_ISSUER).sign(claims())
    header = jwt.get_unverified_header(token)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert header == {"alg": "RS256", "kid": base64.urlsafe_b64encode(hashlib.sha256(der).digest()).decode().rstrip("=")}
    verified = verify_token(token, [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)
    assert (verified.namespace, verified.service_account, verified.pod, verified.jti) == (
        "team", Ref("bot", "sa-uid"), None, "j-1")
    # Any standard JWT library reads it with the public key alone.
    assert jwt.decode(token, key.public_key(), algorithms=["RS256"], audience=AUD,
                      options={"verify_exp": False, "verify_iat": False, "verify_nbf": False})["sub"] == \
        "system:serviceaccount:team:bot"


@pytest.mark.parametrize(("curve", "alg"), [(ec.SECP256R1(), "ES256"), (ec.SECP384R1(), "ES384")])
def test_ecdsa_keys_sign_by_their_curve(curve: ec.EllipticCurve, alg: str) -> None:
    ec_key = ec.generate_private_key(curve)
    token = TokenSigner(ec_key, DEFAULT_ISSUER).sign(claims())
    assert jwt.get_unverified_header(token)["alg"] == alg
    verify_token(token, [ec_key.public_key()], [DEFAULT_ISSUER], AUD, NOW)


@pytest.mark.parametrize(("at", "why"), [
    (NOW + 3600 + 61, "service account token has expired"),
    (NOW - 61, "service account token is not valid yet"),
])
def test_times_hold_with_a_minute_of_leeway(key: rsa.RSAPrivateKey, at: float, why: str) -> None:
    token = TokenSigner(key, DEFAULT_ISSUER).sign(claims())
    for inside in (NOW + 3600 + 59, NOW - 59):
        verify_token(token, [key.public_key()], [DEFAULT_ISSUER], AUD, inside)
    with pytest.raises(InvalidToken, match=why):
        verify_token(token, [key.public_key()], [DEFAULT_ISSUER], AUD, at)


def test_a_token_for_another_audience_is_refused(key: rsa.RSAPrivateKey) -> None:
    token = TokenSigner(key, DEFAULT_ISSUER).sign(claims(audiences=["vault"]))
    with pytest.raises(InvalidToken, match="token audiences is invalid"):
        verify_token(token, [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)
    # One audience of the API's among others is enough.
    token = TokenSigner(key, DEFAULT_ISSUER).sign(claims(audiences=["vault", DEFAULT_ISSUER]))
    verify_token(token, [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)


def test_a_token_of_another_key_or_issuer_is_refused(key: rsa.RSAPrivateKey) -> None:
    other = rsa_key()
    forged = TokenSigner(other, DEFAULT_ISSUER).sign(claims())
    with pytest.raises(InvalidToken, match="invalid signature"):
        verify_token(forged, [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)
    # With both keys (a rotation: the old one still accepted), it verifies.
    verify_token(forged, [key.public_key(), other.public_key()], [DEFAULT_ISSUER], AUD, NOW)
    # Tampering with the payload breaks the signature.
    head, body, sig = TokenSigner(key, DEFAULT_ISSUER).sign(claims()).split(".")
    payload = claims()
    payload["kubernetes.io"]["serviceaccount"]["name"] = "admin"
    tampered = jwt.encode(payload, "x" * 32, algorithm="HS256").split(".")[1]
    with pytest.raises(InvalidToken, match="invalid signature"):
        verify_token(f"{head}.{tampered}.{sig}", [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)
    # An unsigned token ("alg": "none") is never accepted.
    unsigned = jwt.encode(claims(), None, algorithm="none")
    with pytest.raises(InvalidToken):
        verify_token(unsigned, [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)
    elsewhere = TokenSigner(key, "https://other.example").sign(claims(issuer="https://other.example"))
    with pytest.raises(InvalidToken, match="issuer"):
        verify_token(elsewhere, [key.public_key()], [DEFAULT_ISSUER], AUD, NOW)


def test_key_files_as_kube_apiserver_reads_them(tmp_path: Path) -> None:
    key_path, pub_path = ensure_service_account_key(tmp_path / "pki")
    for p in (key_path, pub_path):
        assert p.stat().st_mode & 0o777 == 0o600
    assert key_path.read_bytes().startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    signing = load_signing_key(key_path)
    assert [key_id(k) for k in load_public_keys(pub_path)] == [key_id(signing.public_key())]
    # Made once: a second call keeps the key.
    assert ensure_service_account_key(tmp_path / "pki") == (key_path, pub_path)
    assert load_signing_key(key_path).private_numbers() == signing.private_numbers()
    # A key file may hold several keys, private keys and certificates.
    ca_pem, ca_key_pem = make_ca()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pub_path.read_bytes() + ca_pem + ca_key_pem)
    ca_cert_key = x509.load_pem_x509_certificate(ca_pem).public_key()
    assert [key_id(k) for k in load_public_keys(bundle)] == [key_id(signing.public_key()), key_id(ca_cert_key),
                                                             key_id(ca_cert_key)]
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    with pytest.raises(KeyFileError, match="junk.pem: no PEM-encoded RSA or ECDSA"):
        load_public_keys(junk)
    with pytest.raises(KeyFileError, match="junk.pem: no PEM-encoded RSA or ECDSA private key"):
        load_signing_key(junk)
    tokens = ServiceAccountTokens.from_files(key_path, [bundle], ["https://a.example", "https://b.example"])
    assert tokens.signer.issuer == "https://a.example"
    assert tokens.audiences == ["https://a.example", "https://b.example"]
    assert len(tokens.keys) == 2


# -- against a store: the objects a token names must still be there -------------------------


def obj(kind: str, name: str, uid: str, ns: str = "team", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": ns, "uid": uid, **meta}}


@pytest.fixture
async def store():
    s = open_store("sqlite:///:memory:")
    await s.start()
    yield s
    await s.close()


async def test_a_pod_bound_token_lives_as_long_as_its_pod(store, key: rsa.RSAPrivateKey) -> None:
    clock = FakeClock(NOW)
    auth = ServiceAccountAuthenticator(store, [key.public_key()], [DEFAULT_ISSUER], AUD, clock=clock)
    signer = TokenSigner(key, DEFAULT_ISSUER)
    await store.create("serviceaccounts", "team", "bot", obj("ServiceAccount", "bot", "sa-uid"))
    await store.create("pods", "team", "p", obj("Pod", "p", "pod-uid"))
    token = signer.sign(claims(pod=Ref("p", "pod-uid"), node=Ref("n1", "node-uid")))
    user = await auth.authenticate(token)
    assert user is not None
    assert (user.name, user.uid) == ("system:serviceaccount:team:bot", "sa-uid")
    assert user.groups == ["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"]
    assert user.extra == {POD_NAME_KEY: ["p"], POD_UID_KEY: ["pod-uid"], NODE_NAME_KEY: ["n1"],
                          NODE_UID_KEY: ["node-uid"], CREDENTIAL_ID_KEY: ["JTI=j-1"]}
    # Terminating: valid through the grace period (deletionTimestamp is its end) and a minute more.
    current = await store.get("pods", "team", "p")
    current["metadata"]["deletionTimestamp"] = rfc3339(NOW + 30)
    await store.update("pods", "team", "p", current)
    assert await auth.authenticate(token) is not None
    clock.advance(30 + 61)
    assert await auth.authenticate(token) is None
    # Gone, or replaced by another pod of the same name: refused.
    clock.advance(-91)
    await store.delete("pods", "team", "p")
    assert await auth.authenticate(token) is None
    await store.create("pods", "team", "p", obj("Pod", "p", "other-uid"))
    assert await auth.authenticate(token) is None


async def test_a_token_dies_with_its_service_account(store, key: rsa.RSAPrivateKey) -> None:
    auth = ServiceAccountAuthenticator(store, [key.public_key()], [DEFAULT_ISSUER], AUD, clock=FakeClock(NOW))
    token = TokenSigner(key, DEFAULT_ISSUER).sign(claims())
    assert await auth.authenticate(token) is None  # no such service account
    await store.create("serviceaccounts", "team", "bot", obj("ServiceAccount", "bot", "sa-uid"))
    user = await auth.authenticate(token)
    assert user is not None and user.extra == {CREDENTIAL_ID_KEY: ["JTI=j-1"]}
    await store.delete("serviceaccounts", "team", "bot")
    await store.create("serviceaccounts", "team", "bot", obj("ServiceAccount", "bot", "new-uid"))
    assert await auth.authenticate(token) is None  # same name, another account


async def test_secret_and_node_bound_tokens(store, key: rsa.RSAPrivateKey) -> None:
    auth = ServiceAccountAuthenticator(store, [key.public_key()], [DEFAULT_ISSUER], AUD, clock=FakeClock(NOW))
    signer = TokenSigner(key, DEFAULT_ISSUER)
    await store.create("serviceaccounts", "team", "bot", obj("ServiceAccount", "bot", "sa-uid"))
    await store.create("secrets", "team", "s", obj("Secret", "s", "s-uid"))
    await store.create("nodes", "", "n1", obj("Node", "n1", "node-uid", ns=""))
    by_secret = signer.sign(claims(secret=Ref("s", "s-uid")))
    by_node = signer.sign(claims(node=Ref("n1", "node-uid")))
    assert (await auth.authenticate(by_secret)).extra == {CREDENTIAL_ID_KEY: ["JTI=j-1"]}
    assert (await auth.authenticate(by_node)).extra == {NODE_NAME_KEY: ["n1"], NODE_UID_KEY: ["node-uid"],
                                                        CREDENTIAL_ID_KEY: ["JTI=j-1"]}
    await store.delete("secrets", "team", "s")
    await store.delete("nodes", "", "n1")
    assert await auth.authenticate(by_secret) is None
    assert await auth.authenticate(by_node) is None


async def test_tokens_not_of_the_issuer_are_left_to_other_authenticators(store, key: rsa.RSAPrivateKey) -> None:
    auth = ServiceAccountAuthenticator(store, [key.public_key()], [DEFAULT_ISSUER], AUD, clock=FakeClock(NOW))
    assert not auth.handles("abc.def")
    assert not auth.handles("a.b.c")
    assert not auth.handles(TokenSigner(key, "https://oidc.example").sign(claims(issuer="https://oidc.example")))
    assert auth.handles(TokenSigner(key, DEFAULT_ISSUER).sign(claims()))
