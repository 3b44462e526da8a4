"""What the API server and the node agents prove to each other on the agent's port.

The agent's port (logs, stats, metrics: kube's kubelet port) speaks TLS with a serving
certificate of the cluster's node CA, and answers only requests bearing a short-lived token
of the API server:

* **Serving certificates.** An agent that joined makes its own key (which never leaves the
  node) and sends a certificate request (``NodeCertificateRequest`` of
  bootstrap.gpufleet.io/v1, as the node: ``system:node:<name>``). The API server signs it
  for one name only, ``<node>.nodes.gpufleet.internal`` (``serving_name``), whatever the
  request asks for: the API server dials the node's InternalIP and checks the certificate
  against that name (TLS server name), so a node's certificate proves which node answered
  and is good for nothing else (no IP address, no name of the API server). The node CA is
  not the CA kubectl and pods trust, so a node certificate can never stand in for the API
  server either.
* **Proxy tokens.** Every request to an agent carries a fresh JWT (ES256) of the API
  server's node proxy key: ``aud`` the node's name, ``exp`` 60 s after ``iat``, a random
  ``jti``. The agent checks it with the public key it got with its certificate and keeps the
  ``jti`` of each token it accepted until the token expires: a replayed token, a forged or
  expired one, or one for another node gets 401.

The CA and the token key live in a Secret (kube-system/gpufleet-node-proxy-key) so that every
API server sharing the store signs and verifies alike.
"""

from __future__ import annotations

import base64
import datetime as dt
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.apiserver.auth.certs import make_ca
from gpufleet.utils.nodeauth import TOKEN_ALGORITHM, TOKEN_ISSUER, TOKEN_LIFETIME, serving_name

NODE_SERVING_DAYS = 365


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_secret_data() -> dict[str, str]:
    """The Secret data of a new node CA and token key."""
    ca_cert, ca_key = make_ca("gpufleet-node-ca")
    token_key = _key_pem(ec.generate_private_key(ec.SECP256R1()))
    return {"ca.crt": base64.b64encode(ca_cert).decode(), "ca.key": base64.b64encode(ca_key).decode(),
            "token.key": base64.b64encode(token_key).decode()}


class CertificateRequestError(ValueError):
    pass


@dataclass
class NodeCredentials:
    ca_cert_pem: bytes
    ca_key_pem: bytes
    token_key_pem: bytes

    @classmethod
    def from_secret_data(cls, data: dict[str, str]) -> NodeCredentials | None:
        try:
            return cls(*(base64.b64decode(data[k]) for k in ("ca.crt", "ca.key", "token.key")))
        except (KeyError, ValueError):
            return None

    def __post_init__(self) -> None:
        self._ca_cert = x509.load_pem_x509_certificate(self.ca_cert_pem)
        ca_key = serialization.load_pem_private_key(self.ca_key_pem, password=None)
        token_key = serialization.load_pem_private_key(self.token_key_pem, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey) and isinstance(token_key, ec.EllipticCurvePrivateKey)
        self._ca_key = ca_key
        self._token_key = token_key
        self.token_public_pem = token_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        self._ssl: ssl.SSLContext | None = None

    # -- serving certificates ---------------------------------------------------------------

    def sign(self, node: str, csr_pem: bytes) -> bytes:
        """The serving certificate of ``node`` for the public key of a certificate request."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise CertificateRequestError(f"not a PEM certificate request: {exc}") from None
        if not csr.is_signature_valid:
            raise CertificateRequestError("the certificate request's signature does not verify")
        public = csr.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey | _rsa_public_type()):
            raise CertificateRequestError("the key must be ECDSA or RSA")
        start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")]))
            .issuer_name(self._ca_cert.subject).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=NODE_SERVING_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(serving_name(node))]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                           critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts the node CA only, and checks the server name (``serving_name``)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cadata=self.ca_cert_pem.decode())
        return self._ssl

    # -- proxy tokens -------------------------------------------------------------------------

    def token(self, node: str, *, now: float | None = None, lifetime: int = TOKEN_LIFETIME) -> str:
        iat = int(time.time() if now is None else now)
        claims = {"iss": TOKEN_ISSUER, "sub": "system:apiserver", "aud": node, "iat": iat, "nbf": iat,
                  "exp": iat + lifetime, "jti": uuid.uuid4().hex}
        return jwt.encode(claims, self._token_key, algorithm=TOKEN_ALGORITHM)

    def headers(self, node: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token(node)}"}


def _rsa_public_type() -> Any:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.RSAPublicKey
