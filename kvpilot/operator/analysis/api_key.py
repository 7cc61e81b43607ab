"""The engine's API key for the probe gate: read from the Secret named in spec.engine.apiKeySecretRef.

Read only when a probe set is scored (the operator needs `get` on Secrets for nothing else), never
cached, never logged, never written into any object.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from kvpilot.operator.kube import KubeError
from kvpilot.operator.spec import SecretKeyRef


class ApiKeyError(RuntimeError):
    """The Secret holding the engine's API key cannot be read."""


def read_api_key(kube: Any, namespace: str, ref: SecretKeyRef) -> str:
    """The key's text (surrounding whitespace stripped, as `kvpilot serve --api-key-file` does)."""
    where = f"Secret {namespace}/{ref.name} (spec.engine.apiKeySecretRef)"
    try:
        secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{ref.name}")
    except KubeError as exc:
        if exc.status == 403:
            raise ApiKeyError(f"the operator may not read {where}: the probe gate needs `get` on secrets "
                              "(chart value rbac.readApiKeySecrets=true), or remove analysis.probeSet") from None
        raise ApiKeyError(f"{where} could not be read: HTTP {exc.status}") from None
    if secret is None:
        raise ApiKeyError(f"{where} does not exist: create it with the engine's API key under key {ref.key!r}")
    raw = (secret.get("data") or {}).get(ref.key)
    if raw is None:
        keys = sorted((secret.get("data") or {}).keys())
        raise ApiKeyError(f"{where} has no key {ref.key!r} (it has {keys}): set spec.engine.apiKeySecretRef.key")
    try:
        key = base64.b64decode(raw, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        raise ApiKeyError(f"{where} key {ref.key!r} is not UTF-8 text") from None
    if not key:
        raise ApiKeyError(f"{where} key {ref.key!r} is empty: put the engine's API key in it")
    return key
