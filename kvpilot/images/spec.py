"""What goes into each image, and the commands that build it (pure: spec in, argv out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
VENV = "/opt/kvpilot"
UID = 65532
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Removed from the root filesystem: documentation, caches and apt's lists (no apt at run time).
PRUNE = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
         "/var/cache/apt/*", "/var/lib/apt/lists/*", "/var/cache/debconf/*-old", "/var/log/*",
         "/tmp/*")


@dataclass(frozen=True)
class ImageSpec:
    """One image: the pyproject extras it installs, its Debian packages and its default command."""

    name: str
    extras: tuple[str, ...]
    debian_packages: tuple[str, ...]
    cmd: tuple[str, ...]
    smoke: tuple[str, ...]

    def requirement(self, wheel: Path) -> str:
        return f"{wheel}[{','.join(self.extras)}]"


IMAGES: dict[str, ImageSpec] = {
    # The operator never imports torch: kopf, the Kubernetes client and the pure capacity planner.
    "operator": ImageSpec("kvpilot-operator", ("operator",), ("python3", "python3-venv", "ca-certificates"),
                          cmd=("operator", "--help"), smoke=("operator", "--help")),
    # Engine and sidecar share one image (the pod runs `kvpilot serve` and `kvpilot sidecar`):
    # torch's CUDA wheels from PyPI bring the CUDA runtime; the node's driver comes with the GPU.
    # gcc, libc6-dev and python3-dev: Triton compiles its launcher stubs with the C compiler at start-up.
    "engine": ImageSpec("kvpilot", ("engine", "sidecar"),
                        ("python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "ca-certificates"),
                        cmd=("serve", "--help"), smoke=("sidecar", "--help")),
}


def image_spec(name: str) -> ImageSpec:
    if name not in IMAGES:
        raise KeyError(f"unknown image {name!r}; choose from {', '.join(IMAGES)}")
    return IMAGES[name]


def wheel_command(python: str, source: Path, extras: tuple[str, ...], wheel_dir: Path) -> list[str]:
    """Wheels for kvpilot and every dependency of the extras, built on the host (its pip has the
    network and certificates); the image installs them offline."""
    return [python, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheel_dir),
            f"{source}[{','.join(extras)}]"]


def mmdebstrap_command(spec: ImageSpec, wheel_dir: Path, out_tar: Path, suite: str = DEBIAN_SUITE,
                       mirror: str = DEBIAN_MIRROR) -> list[str]:
    """A root filesystem tarball: Debian's python3, a venv with kvpilot installed, a non-root user."""
    chroot = 'env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$1"'
    install = (f'{chroot} {VENV}/bin/pip install --quiet --no-cache-dir --no-index --find-links /tmp/wheels '
               f'"kvpilot[{",".join(spec.extras)}]"')
    hooks = [
        f'mkdir -p "$1/tmp/wheels" && cp {wheel_dir}/*.whl "$1/tmp/wheels/"',
        f"{chroot} python3 -m venv {VENV}",
        install,
        f"{chroot} {VENV}/bin/pip uninstall --quiet --yes pip",
        f'ln -sf {VENV}/bin/kvpilot "$1/usr/local/bin/kvpilot"',
        f'echo "kvpilot:x:{UID}:{UID}:kvpilot:/tmp:/usr/sbin/nologin" >> "$1/etc/passwd"',
        f'echo "kvpilot:x:{UID}:" >> "$1/etc/group"',
        'rm -rf ' + " ".join(f'"$1"{p}' for p in PRUNE),
        'find "$1/opt" -name __pycache__ -type d -prune -exec rm -rf {} +',
    ]
    return ["mmdebstrap", "--mode=root", "--variant=essential", "--quiet",
            f"--include={','.join(spec.debian_packages)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            *[f"--customize-hook={h}" for h in hooks], suite, str(out_tar), mirror]


def crane_append_command(crane: str, layer: Path, ref: str) -> list[str]:
    return [crane, "append", "--insecure", "--oci-empty-base", "--new_layer", str(layer), "--new_tag", ref]


def crane_mutate_command(crane: str, spec: ImageSpec, ref: str, version: str) -> list[str]:
    """Entry point, user, environment and labels on the pushed image, pushed again as `ref`."""
    return [crane, "mutate", "--insecure", ref, "--tag", ref,
            "--set-platform", "linux/amd64",
            "--entrypoint", "kvpilot", "--cmd", ",".join(spec.cmd), "--user", f"{UID}:{UID}", "--workdir", "/tmp",
            "--env", f"PATH={PATH}", "--env", "PYTHONDONTWRITEBYTECODE=1", "--env", "PYTHONUNBUFFERED=1", "--env", "HOME=/tmp",
            "--label", f"org.opencontainers.image.version={version}",
            "--label", f"org.opencontainers.image.title={spec.name}",
            "--label", "org.opencontainers.image.source=https://github.com/kvpilot/kvpilot"]
