"""Encryption at rest, as kube-apiserver's ``--encryption-provider-config``.

The file is an ``EncryptionConfiguration`` (apiserver.config.k8s.io/v1)::

    apiVersion: apiserver.config.k8s.io/v1
    kind: EncryptionConfiguration
    resources:
      - resources: [secrets]
        providers:
          - aescbc:
              keys:
                - name: key1
                  secret: <base64 of 16, 24 or 32 random bytes>
          - identity: {}

For each listed resource the first provider encrypts what is written; every provider is
tried, in order, for what is read, so a new key put first still reads what the old ones
wrote (rotation), and ``identity`` reads what was stored before encryption was turned on.
A value is stored as ``k8s:enc:<provider>:v1:<key name>:`` followed by the ciphertext
(base64 here, inside a JSON string, since both backends keep values as JSON):

- aescbc: AES-CBC with PKCS#7 padding, a random 16-byte IV before the ciphertext;
- aesgcm: AES-GCM with a random 12-byte nonce, the object's key as authenticated data
  (a value copied onto another object's row does not decrypt).

``secretbox`` (XSalsa20-Poly1305) and ``kms`` are refused with an error naming the field:
``cryptography`` has no XSalsa20. The codec works on the stored text, below watch, list,
get and compaction, which see plain objects as before.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpufleet.store._rows import decode, encode
from gpufleet.store.base import TransformError

PREFIX = "k8s:enc:"
_STORED_PREFIX = '"' + PREFIX  # the stored JSON string of an encrypted value
_AES_KEY_SIZES = (16, 24, 32)
_KNOWN_PROVIDERS = ("aescbc", "aesgcm", "secretbox", "identity", "kms")


class EncryptionConfigError(ValueError):
    """The configuration file is not one the server can run with (the message names the field)."""


def storage_key(resource: str, namespace: str, name: str) -> str:
    """The object's key as kube-apiserver names it in errors (``/registry/secrets/ns/name``)."""
    return "/registry/" + "/".join(p for p in (resource, namespace, name) if p)


class _Provider:
    kind = ""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        self.keys = keys

    def prefix(self, key_name: str) -> str:
        return f"{PREFIX}{self.kind}:v1:{key_name}:"

    def encrypt(self, plain: bytes, context: bytes) -> str:
        name, key = self.keys[0]
        return self.prefix(name) + base64.b64encode(self._seal(key, plain, context)).decode()

    def decrypt(self, value: str, context: bytes) -> bytes | None:
        """The plaintext, or None when none of this provider's keys wrote ``value``."""
        for name, key in self.keys:
            p = self.prefix(name)
            if value.startswith(p):
                try:
                    return self._open(key, base64.b64decode(value[len(p):], validate=True), context)
                except (ValueError, binascii.Error) as exc:
                    raise TransformError(f"{self.kind} key {name!r} does not decrypt it: {exc or 'bad data'}") \
                        from None
        return None

    def _seal(self, key: bytes, plain: bytes, context: bytes) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def _open(self, key: bytes, data: bytes, context: bytes) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError


class _AesCbc(_Provider):
    kind = "aescbc"

    def _seal(self, key: bytes, plain: bytes, context: bytes) -> bytes:
        iv = os.urandom(16)
        padder = padding.PKCS7(128).padder()
        data = padder.update(plain) + padder.finalize()
        enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
        return iv + enc.update(data) + enc.finalize()

    def _open(self, key: bytes, data: bytes, context: bytes) -> bytes:
        if len(data) < 32 or len(data) % 16:
            raise ValueError("the ciphertext is not a whole number of blocks after its IV")
        dec = Cipher(algorithms.AES(key), modes.CBC(data[:16])).decryptor()
        padded = dec.update(data[16:]) + dec.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        return unpadder.update(padded) + unpadder.finalize()


class _AesGcm(_Provider):
    kind = "aesgcm"

    def _seal(self, key: bytes, plain: bytes, context: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + AESGCM(key).encrypt(nonce, plain, context)

    def _open(self, key: bytes, data: bytes, context: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(data) < 12 + 16:
            raise ValueError("the ciphertext is shorter than its nonce and tag")
        try:
            return AESGCM(key).decrypt(data[:12], data[12:], context)
        except InvalidTag:
            raise ValueError("authentication failed (another key, or another object's value)") from None


class _Identity(_Provider):
    kind = "identity"

    def __init__(self) -> None:
        super().__init__([])


@dataclass
class _Rule:
    resources: list[str]
    providers: list[_Provider]

    def matches(self, resource: str) -> bool:
        group = resource.partition(".")[2]
        for r in self.resources:
            if r == resource or r == "*.*":
                return True
            if r.startswith("*.") and r[2:] == group:  # "*." is every core resource
                return True
        return False


class ValueCodec:
    """Turns an object into its stored text and back, encrypting the resources a rule names.
    With no rules (the default) it stores plain JSON, and refuses, clearly, encrypted values
    it has no key for."""

    def __init__(self, rules: list[_Rule] | None = None, source: str = "") -> None:
        self._rules = rules or []
        self._source = source
        self._by_resource: dict[str, list[_Provider]] = {}
        # (resource, namespace, name) -> revision, of objects last read with another key than
        # the one writes use (or unencrypted while encryption is on): an update that changes
        # nothing still rewrites them, as kube-apiserver does, so that `kubectl get secrets
        # -A -o json | kubectl replace -f -` re-encrypts every Secret with the current key.
        self._stale: dict[tuple[str, str, str], int] = {}

    @property
    def encrypting(self) -> bool:
        return any(not isinstance(r.providers[0], _Identity) for r in self._rules)

    def _providers(self, resource: str) -> list[_Provider]:
        found = self._by_resource.get(resource)
        if found is None:
            # The first rule naming a resource wins, as kube-apiserver reads the list.
            found = next((r.providers for r in self._rules if r.matches(resource)), [_Identity()])
            self._by_resource[resource] = found
        return found

    def may_encrypt(self, resource: str) -> bool:
        """Whether values of ``resource`` may be stored encrypted (a provider with a key names
        it), so that the store cannot read their fields (its node index)."""
        return any(not isinstance(p, _Identity) for p in self._providers(resource))

    def is_stale(self, resource: str, namespace: str, name: str, revision: int) -> bool:
        """Whether the object at ``revision`` was stored with another key than writes use."""
        return self._stale.get((resource, namespace, name)) == revision

    def _mark(self, resource: str, namespace: str, name: str, revision: int, stale: bool) -> None:
        if stale:
            self._stale[(resource, namespace, name)] = revision
        elif self._stale:
            self._stale.pop((resource, namespace, name), None)

    def encode(self, resource: str, namespace: str, name: str, obj: dict[str, Any]) -> str:
        text = encode(obj)
        first = self._providers(resource)[0]
        if isinstance(first, _Identity):
            return text
        return orjson.dumps(first.encrypt(text.encode(), storage_key(resource, namespace, name).encode())).decode()

    def decode(self, resource: str, namespace: str, name: str, text: str | bytes, revision: int) -> dict[str, Any]:
        if isinstance(text, bytes):
            text = text.decode()
        if not text.startswith(_STORED_PREFIX):
            # Stored before encryption was on (or for a resource not encrypted): identity
            # reads it, when the resource's providers list it (kube-apiserver's rule).
            providers = self._providers(resource)
            if not any(isinstance(p, _Identity) for p in providers):
                raise TransformError(self._failure(resource, namespace, name, (
                    "it is stored unencrypted and no provider reads it; add `identity: {}` (last) to the "
                    "providers until every object is rewritten")))
            self._mark(resource, namespace, name, revision, not isinstance(providers[0], _Identity))
            return decode(text, revision)
        value = orjson.loads(text)
        context = storage_key(resource, namespace, name).encode()
        providers = self._providers(resource)
        try:
            for p in providers:
                if isinstance(p, _Identity):
                    continue
                plain = p.decrypt(value, context)
                if plain is not None:
                    current = p is providers[0] and value.startswith(p.prefix(p.keys[0][0]))
                    self._mark(resource, namespace, name, revision, not current)
                    return decode(plain, revision)
        except TransformError as exc:
            raise TransformError(self._failure(resource, namespace, name, str(exc))) from None
        written = value[len(PREFIX):].split(":", 3)
        by = f"{written[0]} key {written[2]!r}" if len(written) == 4 else "an unknown provider"
        where = f"the providers of {self._source}" if self._source else \
            "this server (it was started without --encryption-provider-config)"
        raise TransformError(self._failure(resource, namespace, name, (
            f"it is encrypted with {by}, which {where} do not hold; start the server with an "
            "--encryption-provider-config that lists that key")))

    @staticmethod
    def _failure(resource: str, namespace: str, name: str, why: str) -> str:
        return f'unable to transform key "{storage_key(resource, namespace, name)}": {why}'


IDENTITY = ValueCodec()


# ---------------------------------------------------------------------------- the file


def load_encryption_config(path: Path) -> ValueCodec:
    """The codec ``path`` (YAML or JSON) describes. Raises EncryptionConfigError naming the
    field that is wrong, so the server refuses to start rather than store in the clear."""
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise EncryptionConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise EncryptionConfigError(f"{path}: not YAML or JSON: {exc}") from None
    return parse_encryption_config(doc, str(path))


def parse_encryption_config(doc: Any, source: str = "the encryption configuration") -> ValueCodec:
    def fail(field: str, message: str) -> EncryptionConfigError:
        return EncryptionConfigError(f"{source}: {field}: {message}")

    if not isinstance(doc, dict):
        raise fail("(root)", "must be an EncryptionConfiguration object")
    if doc.get("apiVersion") != "apiserver.config.k8s.io/v1" or doc.get("kind") != "EncryptionConfiguration":
        raise fail("apiVersion/kind", f"must be apiserver.config.k8s.io/v1 EncryptionConfiguration, not "
                   f"{doc.get('apiVersion')!r} {doc.get('kind')!r}")
    unknown = sorted(set(doc) - {"apiVersion", "kind", "resources"})
    if unknown:
        raise fail(unknown[0], "unknown field")
    entries = doc.get("resources")
    if not isinstance(entries, list) or not entries:
        raise fail("resources", "at least one resources entry is required")
    rules: list[_Rule] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(entries):
        at = f"resources[{i}]"
        if not isinstance(entry, dict):
            raise fail(at, "must be an object with resources and providers")
        bad = sorted(set(entry) - {"resources", "providers"})
        if bad:
            raise fail(f"{at}.{bad[0]}", "unknown field")
        names = entry.get("resources")
        if not isinstance(names, list) or not names:
            raise fail(f"{at}.resources", "at least one resource is required")
        for j, name in enumerate(names):
            if not isinstance(name, str) or not name or name != name.lower() or " " in name:
                raise fail(f"{at}.resources[{j}]", f"{name!r} is not a resource name (secrets, deployments.apps, "
                           "*.apps, *.*)")
            if name in seen:
                raise fail(f"{at}.resources[{j}]", f"Duplicate value: {name!r} (already in {seen[name]})")
            seen[name] = f"{at}.resources[{j}]"
        providers_doc = entry.get("providers")
        if not isinstance(providers_doc, list) or not providers_doc:
            raise fail(f"{at}.providers", "at least one provider is required")
        rules.append(_Rule([str(n) for n in names],
                           [_provider(p, f"{at}.providers[{k}]", fail) for k, p in enumerate(providers_doc)]))
    return ValueCodec(rules, source)


def _provider(doc: Any, at: str, fail: Any) -> _Provider:
    if not isinstance(doc, dict) or not doc:
        raise fail(at, "must name one provider: aescbc, aesgcm or identity")
    if len(doc) > 1:
        raise fail(at, "more than one provider specified in a single element, should split into different "
                   "list elements")
    (kind, spec), = doc.items()
    if kind not in _KNOWN_PROVIDERS:
        raise fail(f"{at}.{kind}", f"unknown provider; one of {', '.join(_KNOWN_PROVIDERS)}")
    if kind in ("secretbox", "kms"):
        raise fail(f"{at}.{kind}", "not supported by gpufleet; use aescbc or aesgcm")
    if kind == "identity":
        if spec not in (None, {}):
            raise fail(f"{at}.identity", "takes no settings: identity: {}")
        return _Identity()
    if not isinstance(spec, dict) or not isinstance(spec.get("keys"), list) or not spec["keys"]:
        raise fail(f"{at}.{kind}.keys", f"keys is a mandatory field for a {kind} provider (at least one key)")
    bad = sorted(set(spec) - {"keys"})
    if bad:
        raise fail(f"{at}.{kind}.{bad[0]}", "unknown field")
    keys: list[tuple[str, bytes]] = []
    for i, key in enumerate(spec["keys"]):
        where = f"{at}.{kind}.keys[{i}]"
        if not isinstance(key, dict):
            raise fail(where, "must be an object with name and secret")
        name, secret = key.get("name"), key.get("secret")
        if not isinstance(name, str) or not name:
            raise fail(f"{where}.name", f"name is a mandatory field for a key of a {kind} provider")
        if ":" in name:
            raise fail(f"{where}.name", f"{name!r} must not contain ':' (it separates the stored prefix)")
        if any(name == n for n, _ in keys):
            raise fail(f"{where}.name", f"Duplicate value: {name!r}")
        if not isinstance(secret, str) or not secret:
            raise fail(f"{where}.secret", f"secret is a mandatory field for a key of a {kind} provider")
        try:
            raw = base64.b64decode(secret, validate=True)
        except (binascii.Error, ValueError):
            raise fail(f"{where}.secret", "is not valid base64 (make one with: head -c 32 /dev/urandom | "
                       "base64)") from None
        if len(raw) not in _AES_KEY_SIZES:
            raise fail(f"{where}.secret", f"secret is not of the expected length, got {len(raw)}, expected one "
                       f"of {list(_AES_KEY_SIZES)} (bytes, before base64)")
        keys.append((name, raw))
    return _AesCbc(keys) if kind == "aescbc" else _AesGcm(keys)


def generate_config(key_name: str = "key1", resources: tuple[str, ...] = ("secrets",)) -> str:
    """A new EncryptionConfiguration (YAML) with one fresh 32-byte aescbc key, identity last."""
    secret = base64.b64encode(os.urandom(32)).decode()
    listed = ", ".join(resources)
    return ("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
            f"  - resources: [{listed}]\n    providers:\n      - aescbc:\n          keys:\n"
            f"            - name: {key_name}\n              secret: {secret}\n      - identity: {{}}\n")
