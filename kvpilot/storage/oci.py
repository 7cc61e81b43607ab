"""oci://: a model stored as an OCI artifact, read over the registry's distribution API.

Two layouts are read. An artifact (as `oras push` or `crane push` of an OCI layout writes it):
one layer per file, named by its `org.opencontainers.image.title` annotation. An image (as
`crane append -f model.tar` writes it): tar layers whose regular files, at the layer's root, are
the model directory. Every blob's sha256 is checked against its descriptor as it streams.
Registries on loopback are spoken to over plain HTTP, others over HTTPS; a 401 is answered with
the registry's own challenge (a Bearer token from its realm, or Basic) and the Secret's login.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import httpx

from kvpilot.storage.credentials import Credentials
from kvpilot.storage.fetch import TIMEOUT, FetchError, FetchStats, http_error, retrying, safe_path, stream_to
from kvpilot.storage.uri import OciRef

TITLE = "org.opencontainers.image.title"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
TAR_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip",
             "application/vnd.docker.image.rootfs.diff.tar.gzip")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
LOOPBACK = ("localhost", "127.", "[::1]")


class OciFetcher:
    """One artifact or image in a registry."""

    def __init__(self, ref: OciRef, credentials: Credentials, plain_http: bool | None = None) -> None:
        self.ref = ref
        self.credentials = credentials
        host = ref.registry.split(":")[0]
        http = plain_http if plain_http is not None else host == "localhost" or host.startswith(LOOPBACK)
        self.base = f"{'http' if http else 'https'}://{ref.registry}/v2/{ref.repository}"
        self.client = httpx.Client(timeout=TIMEOUT, follow_redirects=True)  # blobs may redirect to storage
        self._auth: str | None = None

    @property
    def name(self) -> str:
        return f"oci://{self.ref.registry}/{self.ref.repository}@{self.ref.reference}"

    def fetch(self, dest: Path) -> FetchStats:
        stats = FetchStats()
        for layer in self._layers():
            title = (layer.get("annotations") or {}).get(TITLE)
            if title:
                path = safe_path(dest, title, f"{self.name}: layer title")
                stats.add(self._blob(layer, path))
            elif layer.get("mediaType") in TAR_TYPES:
                tar_path = dest / f".layer-{layer['digest'].split(':')[-1][:16]}.tar"
                stats.bytes += self._blob(layer, tar_path)
                stats.files += _extract(tar_path, dest, self.name)
                tar_path.unlink()
            else:
                raise FetchError(f"{self.name}: layer {layer.get('digest')} ({layer.get('mediaType')}) has no "
                                 f"{TITLE} annotation and is not a tar layer: the storage initializer reads artifacts "
                                 "with one titled layer per file, or images of tar layers")
        if stats.files == 0:
            raise FetchError(f"{self.name}: the manifest has no layers: nothing to fetch")
        return stats

    def read_config(self) -> bytes:
        for layer in self._layers():
            if (layer.get("annotations") or {}).get(TITLE) == "config.json":
                response = self._get(f"{self.base}/blobs/{layer['digest']}", "config.json blob")
                data = response.read()
                if "sha256:" + hashlib.sha256(data).hexdigest() != layer["digest"]:
                    raise FetchError(f"{self.name}: the config.json blob does not match its digest {layer['digest']}")
                return data
        raise FetchError(f"{self.name}: no layer titled config.json (an image of tar layers cannot be read without "
                         "its weights): set spec.model.config or configMapRef")

    def _layers(self) -> list[dict[str, Any]]:
        manifest = self._manifest(self.ref.reference)
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            chosen = _pick(manifest.get("manifests") or [], self.name)
            manifest = self._manifest(chosen)
        return list(manifest.get("layers") or [])

    def _manifest(self, reference: str) -> dict[str, Any]:
        headers = {"Accept": ", ".join((*MANIFEST_TYPES, *INDEX_TYPES))}
        response = self._get(f"{self.base}/manifests/{reference}", f"manifest {reference}", headers)
        data = response.read()
        if reference.startswith("sha256:") and "sha256:" + hashlib.sha256(data).hexdigest() != reference:
            raise FetchError(f"{self.name}: the registry's manifest does not match the digest {reference}")
        try:
            return json.loads(data)
        except json.JSONDecodeError:
            raise FetchError(f"{self.name}: manifest {reference} is not JSON") from None

    def _blob(self, layer: dict[str, Any], path: Path) -> int:
        digest = str(layer["digest"])
        if not digest.startswith("sha256:"):
            raise FetchError(f"{self.name}: blob digest {digest} is not sha256")
        response = self._get(f"{self.base}/blobs/{digest}", f"blob {digest}", stream=True)
        return stream_to(response, path, f"{self.name}: blob {digest}", digest.removeprefix("sha256:"))

    def _get(self, url: str, what: str, headers: dict[str, str] | None = None, stream: bool = False) -> httpx.Response:
        label = f"{self.name}: {what}"

        def send() -> httpx.Response:
            auth = {"Authorization": self._auth} if self._auth else {}
            request = self.client.build_request("GET", url, headers={**(headers or {}), **auth})
            return self.client.send(request, stream=stream)

        response = retrying(label, send)
        if response.status_code == 401 and self._auth is None:
            response.close()
            self._login(response.headers.get("WWW-Authenticate", ""), label)
            response = retrying(label, send)
        if response.status_code != 200:
            hint = {401: "the registry refused the login: check the credentials Secret (.dockerconfigjson or "
                         "username/password)", 403: "the login may not pull this repository",
                    404: "check the registry, repository and tag"}.get(response.status_code, "")
            raise http_error(label, response, hint)
        return response

    def _login(self, challenge: str, label: str) -> None:
        login = self.credentials.registry_login(self.ref.registry)
        kind = challenge.split(" ", 1)[0].lower()
        if kind == "basic":
            if login is None:
                raise FetchError(f"{label}: the registry wants a login and the credentials Secret has none for "
                                 f"{self.ref.registry}")
            self._auth = "Basic " + base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
            return
        if kind != "bearer":
            raise FetchError(f"{label}: HTTP 401 with challenge {challenge!r}, which is neither Bearer nor Basic")
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        params.setdefault("scope", f"repository:{self.ref.repository}:pull")
        auth = httpx.BasicAuth(*login) if login else None
        response = retrying(f"{label}: token", lambda: self.client.get(realm, params=params, auth=auth))
        if response.status_code != 200:
            raise http_error(f"{label}: token from {realm}", response, "check the credentials Secret")
        body = response.json()
        token = body.get("token") or body.get("access_token")
        if not token:
            raise FetchError(f"{label}: the token service {realm} answered without a token")
        self._auth = f"Bearer {token}"


def _pick(manifests: list[dict[str, Any]], name: str) -> str:
    """From an index: the manifest without a platform (an artifact), else linux/amd64, else the first."""
    if not manifests:
        raise FetchError(f"{name}: the index lists no manifests")
    for m in manifests:
        if not m.get("platform"):
            return str(m["digest"])
    for m in manifests:
        if (m.get("platform") or {}).get("os") == "linux" and m["platform"].get("architecture") == "amd64":
            return str(m["digest"])
    return str(manifests[0]["digest"])


def _extract(tar_path: Path, dest: Path, name: str) -> int:
    """The regular files of a tar layer (no links, devices or paths outside `dest`); whiteouts are skipped."""
    count = 0
    with tarfile.open(tar_path) as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            if member.isdir() or base.startswith(".wh."):
                continue
            if not member.isfile():
                raise FetchError(f"{name}: tar entry {member.name!r} is a link or special file; a model layer "
                                 "holds regular files only")
            path = safe_path(dest, member.name.removeprefix("./"), f"{name}: tar entry")
            path.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, open(path, "wb") as out:
                while block := source.read(1 << 20):
                    out.write(block)
            count += 1
    return count
