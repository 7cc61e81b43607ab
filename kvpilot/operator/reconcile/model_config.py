"""The model's config.json for the preflight: pasted in the spec or a ConfigMap (overrides), else
read from the source itself (oci://, s3://, hf://; a pvc:// or file:// path is not the operator's to read).

A read from a source takes the credentials Secret through the API (spec.model.credentialsSecretRef)
and is kept for CONFIG_TTL_S per (uri, digest, endpoint, Secret version), so a resync does not
fetch again; a pinned source (spec.model.sha256) is read again only when the spec changes.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kvpilot.operator.kube import Kube, KubeError
from kvpilot.operator.spec import ModelRef
from kvpilot.storage.uri import is_remote

CONFIG_TTL_S = 300.0
_cache: dict[tuple[str, ...], tuple[float, dict[str, Any]]] = {}
_lock = threading.Lock()


class ModelConfigUnavailable(RuntimeError):
    """The config cannot be read (yet): a missing ConfigMap or key, or JSON that does not parse."""


def load_model_config(kube: Kube, namespace: str, model: ModelRef) -> dict[str, Any]:
    if model.config is not None:
        return dict(model.config)
    if model.config_map:
        return _from_config_map(kube, namespace, model)
    if is_remote(model.uri):
        return _from_source(kube, namespace, model)
    raise ModelConfigUnavailable(
        f"spec.model.uri {model.uri}: the operator cannot read config.json from a pvc:// or file:// path it does not "
        "mount; set spec.model.config (the checkpoint's config.json inline) or spec.model.configMapRef, or serve "
        "the model from oci://, s3:// or hf://, which the operator reads itself")


def _from_config_map(kube: Kube, namespace: str, model: ModelRef) -> dict[str, Any]:
    cm = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{model.config_map}")
    if cm is None:
        raise ModelConfigUnavailable(f"ConfigMap {namespace}/{model.config_map} (spec.model.configMapRef) not found")
    raw = (cm.get("data") or {}).get(model.config_map_key)
    if raw is None:
        raise ModelConfigUnavailable(
            f"ConfigMap {model.config_map} has no key {model.config_map_key!r}; keys: {sorted(cm.get('data') or {})}"
        )
    return _parse(raw.encode(), f"ConfigMap {model.config_map}/{model.config_map_key}")


def _from_source(kube: Kube, namespace: str, model: ModelRef) -> dict[str, Any]:
    from kvpilot.storage.credentials import BadCredentials, Credentials
    from kvpilot.storage.fetch import FetchError
    from kvpilot.storage.sources import fetcher_for
    from kvpilot.storage.uri import BadModelUri

    secret = _secret(kube, namespace, model.credentials_secret) if model.credentials_secret else None
    version = str(((secret or {}).get("metadata") or {}).get("resourceVersion", ""))
    key = (model.uri, model.sha256, model.endpoint, model.credentials_secret, version)
    with _lock:
        hit = _cache.get(key)
        if hit and (model.sha256 or time.monotonic() - hit[0] < CONFIG_TTL_S):
            return dict(hit[1])
    try:
        raw = fetcher_for(model.uri, Credentials.from_secret(secret), model.endpoint or None).read_config()
    except (FetchError, BadModelUri, BadCredentials) as exc:
        raise ModelConfigUnavailable(f"reading config.json from spec.model.uri: {exc}") from None
    config = _parse(raw, f"{model.uri} config.json")
    with _lock:
        _cache[key] = (time.monotonic(), config)
    return dict(config)


def _secret(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    try:
        secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    except KubeError as exc:
        if exc.status == 403:
            raise ModelConfigUnavailable(
                f"the operator may not read Secret {namespace}/{name} (spec.model.credentialsSecretRef) to fetch "
                "config.json: install the chart with rbac.readModelSecrets=true, or set spec.model.config") from None
        raise
    if secret is None:
        raise ModelConfigUnavailable(f"Secret {namespace}/{name} (spec.model.credentialsSecretRef) not found")
    return secret


def _parse(raw: bytes, where: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigUnavailable(f"{where} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ModelConfigUnavailable(f"{where} is not a JSON object")
    return parsed
