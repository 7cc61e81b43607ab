"""Credentials of a model source: the keys of one Secret, read as mounted files or from the API.

One Secret serves every scheme (spec.model.credentialsSecretRef); the keys each scheme reads:
s3 `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (optional `AWS_SESSION_TOKEN`, `AWS_REGION`);
hf `HF_TOKEN`; oci a `.dockerconfigjson` (an imagePullSecret as `kubectl create secret
docker-registry` writes it) or `username` and `password`. Values never enter a pod spec: the
init container mounts the Secret as files, the operator reads it through the API.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "HF_TOKEN")
DOCKER_CONFIG = ".dockerconfigjson"


class BadCredentials(ValueError):
    """A credentials Secret whose keys cannot be used as written."""


@dataclass(frozen=True)
class Credentials:
    """Key -> value of the credentials Secret (empty: anonymous access)."""

    values: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dir(cls, directory: Path | None) -> Credentials:
        """A mounted Secret volume (one file per key), falling back to the process environment."""
        values = {k: os.environ[k] for k in ENV_KEYS if os.environ.get(k)}
        if directory is not None:
            if not directory.is_dir():
                raise BadCredentials(f"credentials directory {directory} does not exist (is the Secret mounted?)")
            for path in directory.iterdir():
                if path.is_file() and not path.name.startswith(".."):  # the kubelet's ..data links
                    values[path.name] = path.read_text().strip() if path.name != DOCKER_CONFIG else path.read_text()
        return cls(values)

    @classmethod
    def from_secret(cls, secret: Mapping[str, object] | None) -> Credentials:
        """A Secret object as the API returns it (data base64-encoded)."""
        if not secret:
            return cls()
        data = secret.get("data") or {}
        assert isinstance(data, Mapping)
        values = {}
        for key, raw in data.items():
            text = base64.b64decode(str(raw)).decode()
            values[str(key)] = text if key == DOCKER_CONFIG else text.strip()
        return cls(values)

    def get(self, key: str) -> str | None:
        return self.values.get(key) or None

    def registry_login(self, registry: str) -> tuple[str, str] | None:
        """(user, password) for a registry host: `username`/`password` keys, else the docker config's entry."""
        if self.get("username") and self.get("password"):
            return str(self.get("username")), str(self.get("password"))
        raw = self.get(DOCKER_CONFIG)
        if not raw:
            return None
        try:
            auths = json.loads(raw).get("auths") or {}
        except (json.JSONDecodeError, AttributeError):
            raise BadCredentials(f"credentials key {DOCKER_CONFIG} is not a docker config JSON document") from None
        for host, entry in auths.items():
            if _host(host) != registry:
                continue
            if entry.get("username") and entry.get("password"):
                return str(entry["username"]), str(entry["password"])
            if entry.get("auth"):
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
                if not sep:
                    raise BadCredentials(f"{DOCKER_CONFIG} auth for {host} is not base64 of user:password")
                return user, password
        return None


def _host(entry: str) -> str:
    """A docker config key (`host`, `https://host/v1/`) -> host[:port]."""
    return entry.split("://", 1)[-1].split("/", 1)[0]
