"""The agent's serving certificate and the key that checks the API server's proxy tokens.

After the join, the agent makes a key (kept in <agent-state-dir>/serving.key, 0600; it never
leaves the node), asks the API server, as its node, to certify it (a NodeCertificateRequest
of bootstrap.gpufleet.io/v1, the kubelet's serving CSR in spirit) and keeps the answer:
serving.crt (signed by the cluster's node CA for ``<node>.nodes.gpufleet.internal`` only)
and proxy-token.pub (the API server's public key for the short-lived tokens it shows on the
agent's port, gpufleet/utils/nodeauth.py). A certificate within 30 days of its end, or for
another name, is asked for again at the next start.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.client import Client
from gpufleet.client.errors import NotFound
from gpufleet.utils.files import private_dir, write_private
from gpufleet.utils.nodeauth import ProxyTokenVerifier, serving_name

log = logging.getLogger(__name__)

KEY_FILE = "serving.key"
CERT_FILE = "serving.crt"
TOKEN_KEY_FILE = "proxy-token.pub"
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class ServingCredentials:
    node: str
    cert_file: Path
    key_file: Path
    token_key: bytes

    def verifier(self) -> ProxyTokenVerifier:
        return ProxyTokenVerifier(self.token_key, self.node)


def saved_serving(state_dir: Path, node: str) -> ServingCredentials | None:
    """What an earlier start kept, when it is still good for ``node``."""
    cert, key, pub = state_dir / CERT_FILE, state_dir / KEY_FILE, state_dir / TOKEN_KEY_FILE
    if not (cert.exists() and key.exists() and pub.exists()):
        return None
    try:
        parsed = x509.load_pem_x509_certificate(cert.read_bytes())
        names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if names.get_values_for_type(x509.DNSName) != [serving_name(node)]:
        return None
    if parsed.not_valid_after_utc - dt.datetime.now(dt.UTC) < RENEW_BEFORE:
        return None
    return ServingCredentials(node, cert, key, pub.read_bytes())


async def ensure_serving(client: Client, node: str, state_dir: Path) -> ServingCredentials | None:
    """The agent's serving credentials: kept ones, or new ones from the API server. None when
    the server serves no NodeCertificateRequest (an --insecure one): the port stays plain."""
    kept = saved_serving(state_dir, node)
    if kept is not None:
        return kept
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName(serving_name(node))]), critical=False)
           .sign(key, hashes.SHA256()))
    body = {"apiVersion": "bootstrap.gpufleet.io/v1", "kind": "NodeCertificateRequest", "metadata": {"name": node},
            "spec": {"request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode()}}
    try:
        resp = await client.raw_request("POST", "/apis/bootstrap.gpufleet.io/v1/nodecertificaterequests", json=body)
    except NotFound:
        log.warning("agent %s: the API server issues no serving certificates (--insecure?); the agent's port "
                    "serves plain HTTP to anyone", node)
        return None
    status = json.loads(resp.body)["status"]
    private_dir(state_dir)
    write_private(state_dir / KEY_FILE, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    write_private(state_dir / CERT_FILE, base64.b64decode(status["certificate"]))
    write_private(state_dir / TOKEN_KEY_FILE, status["proxyTokenKey"].encode())
    log.info("agent %s: serving certificate for %s saved in %s", node, status.get("serverName"), state_dir)
    return ServingCredentials(node, state_dir / CERT_FILE, state_dir / KEY_FILE, status["proxyTokenKey"].encode())
