"""Build an image: host wheels -> mmdebstrap root filesystem -> crane push to a loopback registry
-> crane mutate -> a `docker load`-able tarball; then a smoke run of the image's own layers."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kvpilot import __version__
from kvpilot.cluster.build import binary_path
from kvpilot.images.spec import (
    ImageSpec,
    crane_append_command,
    crane_mutate_command,
    mmdebstrap_command,
    wheel_command,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
# The name the tarball carries (`docker load` tags it so); the chart's default image.repository.
DEFAULT_REPOSITORY = "ghcr.io/kvpilot"


@dataclass(frozen=True)
class BuiltImage:
    """Where an image landed and what it cost."""

    name: str
    tarball: Path
    ref: str
    seconds: float
    rootfs_bytes: int
    compressed_bytes: int
    config: dict


def require_tools() -> str:
    """The crane binary; a clear error for each missing tool or permission."""
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is not installed: `apt-get install mmdebstrap` (Debian's package)")
    if os.geteuid() != 0:
        raise RuntimeError("mmdebstrap --mode=root and the chroot smoke run need root; run as root")
    crane = binary_path("crane")
    if not os.access(crane, os.X_OK):
        raise RuntimeError(f"crane is not built at {crane}: run `kvpilot cluster build crane`")
    return str(crane)


def _run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}): {' '.join(cmd)[:600]}\n"
                           f"{(result.stderr or result.stdout)[-3000:]}")
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackRegistry:
    """`crane registry serve` on 127.0.0.1 with blobs on disk, for the push and the mutate."""

    def __init__(self, crane: str, disk: Path) -> None:
        disk.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.proc = subprocess.Popen([crane, "registry", "serve", "--address", f"127.0.0.1:{self.port}",
                                      "--disk", str(disk)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError(f"crane registry did not listen on 127.0.0.1:{self.port} within 20 s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def build_image(spec: ImageSpec, out_dir: Path, repository: str = DEFAULT_REPOSITORY, python: str = sys.executable,
                log=print) -> BuiltImage:  # type: ignore[no-untyped-def]
    crane = require_tools()
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=out_dir))
    try:
        wheels = work / "wheels"
        log(f"{spec.name}: wheels for kvpilot[{','.join(spec.extras)}]")
        _run(wheel_command(python, REPO_ROOT, spec.extras, wheels), "pip wheel")
        rootfs = work / "rootfs.tar"
        log(f"{spec.name}: root filesystem (mmdebstrap)")
        _run(mmdebstrap_command(spec, wheels, rootfs), "mmdebstrap", stdin=subprocess.DEVNULL)
        rootfs_bytes = rootfs.stat().st_size
        registry = LoopbackRegistry(crane, work / "registry")
        try:
            ref = f"127.0.0.1:{registry.port}/{spec.name}:{__version__}"
            log(f"{spec.name}: crane append + mutate, pushed to {ref}")
            _run(crane_append_command(crane, rootfs, ref), "crane append")
            _run(crane_mutate_command(crane, spec, ref, __version__), "crane mutate")
            config = json.loads(_run([crane, "config", "--insecure", ref], "crane config").stdout)
            manifest = json.loads(_run([crane, "manifest", "--insecure", ref], "crane manifest").stdout)
            pulled = work / "pulled.tar"
            _run([crane, "pull", "--insecure", ref, str(pulled)], "crane pull")
        finally:
            registry.close()
        tarball = out_dir / f"{spec.name}-{__version__}.tar"
        retag(pulled, tarball, f"{repository}/{spec.name}:{__version__}")
        compressed = sum(layer["size"] for layer in manifest["layers"])
        return BuiltImage(spec.name, tarball, ref, time.monotonic() - started, rootfs_bytes, compressed, config)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def retag(src: Path, dest: Path, tag: str) -> None:
    """Copy a `docker save`-format tarball, naming the image `tag` in its manifest.json."""
    with tarfile.open(src) as inp, tarfile.open(dest, "w") as out:
        for member in inp.getmembers():
            data = inp.extractfile(member) if member.isfile() else None
            if member.name == "manifest.json" and data is not None:
                manifest = json.load(data)
                manifest[0]["RepoTags"] = [tag]
                body = json.dumps(manifest).encode()
                member.size = len(body)
                out.addfile(member, io.BytesIO(body))
            else:
                out.addfile(member, data)


def unpack(tarball: Path, dest: Path) -> dict:
    """Extract the image's layers (from the tarball, not the build's root filesystem) into `dest`;
    returns the image config."""
    with tarfile.open(tarball) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
        config = json.load(outer.extractfile(manifest["Config"]))  # type: ignore[arg-type]
        for layer in manifest["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer), mode="r:*") as inner:
                inner.extractall(dest, filter="fully_trusted")
    return config


def run_in(root: Path, config: dict, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `argv` with chroot in an unpacked image, as the image's user and with its environment."""
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    user = config.get("User") or "0:0"
    return subprocess.run(["chroot", f"--userspec={user}", str(root), *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd="/")


def smoke(tarball: Path, args: tuple[str, ...], timeout: float = 120) -> subprocess.CompletedProcess:
    """`<entrypoint> ARGS` in the unpacked image (its layers, not the build's root filesystem)."""
    with tempfile.TemporaryDirectory(prefix="kvpilot-image-") as tmp:
        config = unpack(tarball, Path(tmp))["config"]
        return run_in(Path(tmp), config, [*config["Entrypoint"], *args], timeout)
