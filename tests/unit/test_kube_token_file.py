"""The operator's client follows a rotated token file (tests/cluster/test_token_rotation.py: the real API server)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from kvpilot.operator.kube import Kube, TokenFile, kubeconfig_token_file

pytestmark = pytest.mark.unit


def server(valid: set[str], seen: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization", "").removeprefix("Bearer ") in valid:
            return httpx.Response(200, json={"kind": "Status"})
        return httpx.Response(401, json={"kind": "Status", "reason": "Unauthorized"})
    return httpx.MockTransport(handle)


def client(token_file: Path, transport: httpx.MockTransport) -> Kube:
    kube = Kube("http://api.invalid", ca_file=None, cert=None, token=None, verify=False, token_file=token_file)
    kube._http = httpx.Client(base_url="http://api.invalid", transport=transport, auth=kube.token_file)
    return kube


def test_a_rewritten_token_file_is_used_at_the_next_request(tmp_path: Path) -> None:
    path, seen = tmp_path / "token", []
    path.write_text("one\n")
    kube = client(path, server({"one", "two-longer"}, seen))
    kube.request("GET", "/api")
    path.write_text("two-longer")  # size and mtime change: read again without waiting for the minute
    os.utime(path, ns=(1, 1))
    kube.request("GET", "/api")
    assert seen == ["Bearer one", "Bearer two-longer"]  # no 401 first: the change was noticed


def test_401_rereads_the_file_and_retries_once(tmp_path: Path) -> None:
    path, seen = tmp_path / "token", []
    path.write_text("old")
    kube = client(path, server({"new"}, seen))
    auth = kube.token_file
    assert auth is not None
    auth.refresh_s = 3600
    stat = path.stat()
    path.write_text("new")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: only the 401 tells
    auth._stamp = (path.stat().st_ino, stat.st_mtime_ns, stat.st_size)
    assert kube.request("GET", "/api") == {"kind": "Status"}
    assert seen == ["Bearer old", "Bearer new"]


def test_a_token_still_refused_after_rereading_is_an_error(tmp_path: Path) -> None:
    path, seen = tmp_path / "token", []
    path.write_text("bad")
    kube = client(path, server(set(), seen))
    with pytest.raises(Exception, match="401"):
        kube.request("GET", "/api")
    assert seen == ["Bearer bad"]  # the file did not change: no pointless retry


def test_empty_or_missing_token_file_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        TokenFile(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        TokenFile(tmp_path / "missing")


def test_kubeconfig_token_file_of_the_current_user(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("""
current-context: b
contexts:
- {name: a, context: {cluster: c, user: ua}}
- {name: b, context: {cluster: c, user: ub}}
users:
- {name: ua, user: {token: literal}}
- {name: ub, user: {tokenFile: sa/token}}
""")
    assert kubeconfig_token_file(str(config)) == str(tmp_path / "sa" / "token")
    config.write_text(config.read_text().replace("current-context: b", "current-context: a"))
    assert kubeconfig_token_file(str(config)) is None
