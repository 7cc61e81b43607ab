"""A real OCI registry on loopback (`crane registry serve`, built by `kvpilot cluster build`) and
the two ways a model is pushed to one with crane itself.

    with CraneRegistry(workdir) as reg:
        reg.push_artifact(model_dir, "models/tiny:v1")   # one layer per file, titled (as oras push)
        reg.push_tar_image(model_dir, "models/tiny:tar")  # `crane append -f model.tar` (one tar layer)

The artifact is written as an OCI image layout (index.json, blobs/sha256/...) and pushed with
`crane push DIR REF`, so what lands in the registry is what crane, a real client, uploads.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
from pathlib import Path

from tests.harness.background import Background, built_binary

ARTIFACT_TYPE = "application/vnd.kvpilot.model.v1"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
LAYER_TYPE = "application/vnd.kvpilot.model.file.v1"


def crane_binary() -> Path:
    return built_binary("crane")


def crane(*args: str, timeout: float = 120) -> str:
    result = subprocess.run([str(crane_binary()), *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"crane {' '.join(args)} failed: {result.stderr}"
    return result.stdout.strip()


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def write_artifact_layout(model_dir: Path, layout: Path, files: list[str] | None = None) -> Path:
    """An OCI image layout holding `model_dir`'s files as one titled layer each (OCI 1.1 artifact)."""
    layers = []
    for name in files or sorted(p.name for p in model_dir.iterdir() if p.is_file()):
        digest, size = _blob(layout, (model_dir / name).read_bytes())
        layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size,
                       "annotations": {"org.opencontainers.image.title": name}})
    config_digest, config_size = _blob(layout, b"{}")
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "artifactType": ARTIFACT_TYPE,
                           "config": {"mediaType": EMPTY_CONFIG, "digest": config_digest, "size": config_size},
                           "layers": layers}).encode()
    digest, size = _blob(layout, manifest)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
                       "artifactType": ARTIFACT_TYPE}]}))
    return layout


class CraneRegistry:
    """`crane registry serve --disk` on a free loopback port; stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "registry.log"
        self.host = ""
        self.process = Background([str(crane_binary()), "registry", "serve", "--address", "127.0.0.1:0",
                                   "--disk", str(self.workdir / "blobs")], self.log, "crane registry")

    def __enter__(self) -> CraneRegistry:
        (self.workdir / "blobs").mkdir(exist_ok=True)  # crane's disk blob handler does not create it
        self.host = self.process.start(self._serving)
        return self

    def _serving(self) -> str | None:
        match = re.search(r"serving on port (\d+)", self.log.read_text())
        return f"127.0.0.1:{match.group(1)}" if match else None

    def stop(self) -> None:
        self.process.stop()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def push_artifact(self, model_dir: Path, ref: str, files: list[str] | None = None) -> str:
        """`oci://host/ref`, pushed as a titled-layer artifact; returns the URI."""
        layout = write_artifact_layout(model_dir, self.workdir / f"layout-{ref.replace('/', '_')}", files)
        crane("push", str(layout), f"{self.host}/{ref}")
        return f"oci://{self.host}/{ref}"

    def push_tar_image(self, model_dir: Path, ref: str) -> str:
        """`oci://host/ref`, an image of one tar layer holding the directory's files at its root."""
        tar_path = self.workdir / f"{ref.replace('/', '_')}.tar"
        with tarfile.open(tar_path, "w") as tar:
            for path in sorted(model_dir.iterdir()):
                if path.is_file():
                    tar.add(path, arcname=path.name)
        crane("append", "--oci-empty-base", "-f", str(tar_path), "-t", f"{self.host}/{ref}")
        return f"oci://{self.host}/{ref}"
