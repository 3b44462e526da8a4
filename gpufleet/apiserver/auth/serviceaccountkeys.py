"""Service account signing and verification keys: PEM files, key ids and JWT algorithms.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gpufleet.utils.files import write_private

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey

_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


# ---------------------------------------------------------------------------------- keys


class KeyFileError(ValueError):
    pass


def ensure_service_account_key(directory: Path) -> tuple[Path, Path]:
    """(sa.key, sa.pub) under ``directory``: an RSA 2048 key made once (as kubeadm makes
    it), both files mode 0600. A missing sa.pub is written again from sa.key."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_path, pub_path = directory / "sa.key", directory / "sa.pub"
    if not key_path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        write_private(key_path, key.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.TraditionalOpenSSL,
                                                   serialization.NoEncryption()))
        pub_path.unlink(missing_ok=True)
    if not pub_path.exists():
        write_private(pub_path, public_pem(load_signing_key(key_path).public_key()))
    return key_path, pub_path


def public_pem(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem_blocks(data: bytes) -> list[bytes]:
    out, current = [], []
    for line in data.splitlines(keepends=True):
        if line.startswith(b"-----BEGIN "):
            current = [line]
        elif current:
            current.append(line)
            if line.startswith(b"-----END "):
                out.append(b"".join(current))
                current = []
    return out


def load_signing_key(path: Path) -> PrivateKey:
    """The first RSA or ECDSA private key in a PEM file."""
    data = _read(path)
    for block in _pem_blocks(data):
        if b"PRIVATE KEY" not in block.split(b"\n", 1)[0]:
            continue
        try:
            key = serialization.load_pem_private_key(block, password=None)
        except (ValueError, TypeError) as e:
            raise KeyFileError(f"{path}: cannot read the private key: {e}") from None
        if isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
            return key
        raise KeyFileError(f"{path}: the private key must be RSA or ECDSA, not {type(key).__name__}")
    raise KeyFileError(f"{path}: no PEM-encoded RSA or ECDSA private key found")


def load_public_keys(path: Path) -> list[PublicKey]:
    """Every RSA or ECDSA key of a PEM file: public keys, the public half of private keys,
    and the keys of certificates (what kube-apiserver's --service-account-key-file takes)."""
    keys: list[PublicKey] = []
    for block in _pem_blocks(_read(path)):
        header = block.split(b"\n", 1)[0]
        try:
            if b"PRIVATE KEY" in header:
                key: Any = serialization.load_pem_private_key(block, password=None).public_key()
            elif b"CERTIFICATE" in header:
                key = x509.load_pem_x509_certificate(block).public_key()
            elif b"PUBLIC KEY" in header:
                key = serialization.load_pem_public_key(block)
            else:
                continue
        except (ValueError, TypeError) as e:
            what = header.decode(errors="replace").strip().strip("-")
            raise KeyFileError(f"{path}: cannot read the {what}: {e}") from None
        if isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
            keys.append(key)
    if not keys:
        raise KeyFileError(f"{path}: no PEM-encoded RSA or ECDSA key found")
    return keys


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"{path}: {e.strerror}") from None


def key_id(key: PublicKey) -> str:
    """kube-apiserver's key id: base64url (no padding) of the SHA-256 of the DER public key."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()


def algorithm(key: PrivateKey | PublicKey) -> str:
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return "RS256"
    alg = _EC_ALGORITHMS.get(key.curve.name)
    if alg is None:
        raise KeyFileError(f"ECDSA curve {key.curve.name} is not supported (P-256, P-384 or P-521)")
    return alg
