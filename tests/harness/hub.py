"""A local stand-in for the Hugging Face Hub's HTTP API, serving model directories as the Hub lays
them out, so tests run the real `huggingface_hub` client against it (endpoint= or HF_ENDPOINT).

    with LocalHub({"org/tiny": model_dir}, token="hf_x") as hub:   # repo id -> directory (host="..." to bind elsewhere)
        snapshot_download("org/tiny", endpoint=hub.url, token="hf_x", local_dir=...)
        hub.downloads                                                # GETs of file contents so far

Routes (those huggingface_hub's snapshot_download and hf_hub_download call):
  GET  /api/models/<repo>/revision/<rev>          repo info: sha (the commit), siblings
  GET  /api/models/<repo>/tree/<rev>[?recursive]  files: path, size, oid (git blob sha1), lfs {oid, size}
  HEAD|GET /<repo>/resolve/<rev>/<path>           small files: 200 with ETag (blob sha1), X-Repo-Commit;
                                                  *.safetensors (LFS): 302 to <the CDN port>/lfs/<sha256> with
                                                  X-Linked-Etag (sha256) and X-Linked-Size, as the Hub does
  GET  /lfs/<sha256>                              the LFS object
The revision `main` and the commit (a sha1 of the directory's manifest) both resolve. With
`token`, every route but /lfs answers 401 without `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors",)


def _blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Repo:
    def __init__(self, root: Path) -> None:
        self.files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
        manifest = "".join(f"{_blob_sha1(p.read_bytes())} {name}\n" for name, p in self.files.items())
        self.commit = hashlib.sha1(manifest.encode()).hexdigest()

    def entry(self, name: str) -> dict[str, Any]:
        data = self.files[name].read_bytes()
        out: dict[str, Any] = {"type": "file", "path": name, "size": len(data), "oid": _blob_sha1(data)}
        if name.endswith(LFS_SUFFIXES):
            out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out


class LocalHub:
    """A threaded HTTP server on a free loopback port."""

    def __init__(self, repos: Mapping[str, Path], token: str | None = None, host: str = "127.0.0.1") -> None:
        self.repos = {repo_id: _Repo(Path(d)) for repo_id, d in repos.items()}
        self.token = token
        self.downloads: list[str] = []  # paths whose content was sent (GET of a file or an LFS object)
        self.requests: list[str] = []
        # The API on one port, the LFS objects on another (the Hub's CDN is another origin: huggingface_hub
        # follows only same-origin redirects of a HEAD, and reads X-Linked-* from the 302 itself).
        self._servers = [ThreadingHTTPServer((host, 0), self._handler()) for _ in range(2)]
        self.url, self.lfs_url = (f"http://{host}:{s.server_address[1]}" for s in self._servers)
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self._servers]

    def __enter__(self) -> LocalHub:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._route(send_body=False)

            def do_GET(self) -> None:
                self._route(send_body=True)

            def _reply(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None,
                       send_body: bool = True) -> None:  # fmt: skip
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def _json(self, status: int, doc: Any, send_body: bool = True) -> None:
                self._reply(status, json.dumps(doc).encode(), {"Content-Type": "application/json"}, send_body)

            def _error(self, status: int, code: str, message: str, send_body: bool) -> None:
                self._reply(status, json.dumps({"error": message}).encode(),
                            {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message},
                            send_body)

            def _route(self, send_body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                if path.startswith("/lfs/"):
                    return self._lfs(path.removeprefix("/lfs/"), send_body)
                if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._error(401, "RepoNotFound", "Invalid credentials in Authorization header", send_body)
                if path.startswith("/api/models/"):
                    return self._api(path.removeprefix("/api/models/"), send_body)
                if "/resolve/" in path:
                    return self._resolve(path, send_body)
                return self._error(404, "EntryNotFound", f"no route {path}", send_body)

            def _repo(self, repo_id: str, revision: str, send_body: bool) -> _Repo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", f"Repository {repo_id} not found", send_body)
                    return None
                if revision not in ("main", repo.commit):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", send_body)
                    return None
                return repo

            def _api(self, rest: str, send_body: bool) -> None:
                for kind in ("/revision/", "/tree/"):
                    if kind in rest:
                        repo_id, _, tail = rest.partition(kind)
                        revision, _, sub = tail.partition("/")
                        repo = self._repo(repo_id, revision, send_body)
                        if repo is None:
                            return
                        if kind == "/revision/":
                            return self._json(200, {"id": repo_id, "modelId": repo_id, "sha": repo.commit,
                                                    "private": False, "siblings": [{"rfilename": n} for n in repo.files]},
                                              send_body)
                        names = [n for n in repo.files if not sub or n.startswith(sub.rstrip("/") + "/")]
                        return self._json(200, [repo.entry(n) for n in names], send_body)
                self._error(404, "EntryNotFound", f"no API route {rest}", send_body)

            def _resolve(self, path: str, send_body: bool) -> None:
                repo_id, _, tail = path.lstrip("/").partition("/resolve/")
                revision, _, name = tail.partition("/")
                repo = self._repo(repo_id, revision, send_body)
                if repo is None:
                    return
                if name not in repo.files:
                    return self._error(404, "EntryNotFound", f"{name} does not exist at {revision}", send_body)
                entry = repo.entry(name)
                common = {"X-Repo-Commit": repo.commit}
                if "lfs" in entry:
                    sha = entry["lfs"]["oid"]
                    return self._reply(302, b"", {**common, "Location": f"{hub.lfs_url}/lfs/{sha}",
                                                  "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(entry["size"]),
                                                  "ETag": f'"{entry["oid"]}"'}, send_body)
                data = repo.files[name].read_bytes()
                if send_body:
                    hub.downloads.append(path)
                self._reply(200, data, {**common, "ETag": f'"{entry["oid"]}"'}, send_body)

            def _lfs(self, sha: str, send_body: bool) -> None:
                for repo in hub.repos.values():
                    for name in repo.files:
                        entry = repo.entry(name)
                        if entry.get("lfs", {}).get("oid") == sha:
                            if send_body:
                                hub.downloads.append(f"/lfs/{sha}")
                            return self._reply(200, repo.files[name].read_bytes(), {}, send_body)
                self._error(404, "EntryNotFound", f"no LFS object {sha}", send_body)

        return Handler
