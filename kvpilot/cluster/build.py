"""Build the local control plane's binaries from the Go modules under tools/.

Each tools/<dir>/go.mod pins one upstream release; its version is read from that go.mod, so the
Go files are the single source of truth. Binaries land in a version-keyed cache outside the
repository, `${KVPILOT_CACHE_DIR:-~/.cache/kvpilot}/bin/<name>-<version>/<binary>`, so a fresh
clone on the same machine reuses them; a component is rebuilt only when one of its binaries is
missing or does not report the expected version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / "tools"
GO_FALLBACK_DIRS = ("/usr/local/go/bin", str(Path.home() / "go" / "bin"))


@dataclass(frozen=True)
class Component:
    """One Go module under tools/ and the binaries it builds (binary name -> Go package)."""

    name: str
    tools_subdir: str
    module: str
    binaries: dict[str, str]
    version_args: tuple[str, ...] = ("--version",)
    ldflags: tuple[str, ...] = field(default=())

    def version(self, tools_dir: Path = TOOLS_DIR) -> str:
        return module_version((tools_dir / self.tools_subdir / "go.mod").read_text(), self.module)

    def version_marker(self, tools_dir: Path = TOOLS_DIR) -> str:
        """What `<binary> <version_args>` must print: the version without a leading v."""
        return self.version(tools_dir).removeprefix("v")


def _kubernetes_ldflags(version: str) -> list[str]:
    major, minor = version.removeprefix("v").split(".")[:2]
    date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={date}",
        ]
    return flags


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", "etcd", "go.etcd.io/etcd/server/v3", {"etcd": "go.etcd.io/etcd/server/v3"}),
    Component(
        "kubernetes",
        "k8s",
        "k8s.io/kubernetes",
        {c: f"k8s.io/kubernetes/cmd/{c}" for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")},
    ),
    Component("kwok", "kwok", "sigs.k8s.io/kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
    Component("helm", "helm", "helm.sh/helm/v4", {"helm": "helm.sh/helm/v4/cmd/helm"}, ("version", "--short")),
    # Not a control-plane component: crane assembles the container images without a daemon (`make images`).
    Component("crane", "crane", "github.com/google/go-containerregistry",
              {"crane": "github.com/google/go-containerregistry/cmd/crane"}, ("version",)),
    # Not a control-plane component: an S3-compatible server (posix backend) the storage initializer's
    # s3:// tests fetch from (tests/harness/s3_server.py).
    Component("versitygw", "versitygw", "github.com/versity/versitygw",
              {"versitygw": "github.com/versity/versitygw/cmd/versitygw"}),
)


def module_version(gomod: str, module: str) -> str:
    """The version `go.mod` requires for `module` (in a require line or block)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod, re.MULTILINE)
    if not match:
        raise ValueError(f"go.mod does not require {module}; run the tools/ generator or `go get` it")
    return match.group(1)


def go_module_dir(module: str, tools_subdir: str, what: str, tools_dir: Path = TOOLS_DIR) -> Path:
    """Where Go's module cache holds `module` at the version tools/<tools_subdir>/go.mod pins
    (downloaded on first use); `what` names it in the errors."""
    if shutil.which("go", path=go_env()["PATH"]) is None:
        raise RuntimeError("`go` not found on PATH or in /usr/local/go/bin; install Go >= 1.26 "
                           f"(needed once, to download {what})")
    cwd = tools_dir / tools_subdir
    cmd = ["go", "mod", "download", "-json", module]
    result = subprocess.run(cmd, cwd=cwd, env=go_env(), capture_output=True, text=True, timeout=600)
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or "Dir" not in info:
        raise RuntimeError(f"`cd {cwd} && {' '.join(cmd)}` failed (exit {result.returncode}): "
                           f"{info.get('Error') or result.stderr.strip() or result.stdout.strip()}")
    want = module_version((cwd / "go.mod").read_text(), module)
    if info.get("Version") != want:
        raise RuntimeError(f"go resolved {module} to {info.get('Version')}, but tools/{tools_subdir}/go.mod pins {want}")
    return Path(info["Dir"])


def cache_dir() -> Path:
    return Path(os.environ.get("KVPILOT_CACHE_DIR") or Path.home() / ".cache" / "kvpilot")


def component_dir(component: Component, tools_dir: Path = TOOLS_DIR) -> Path:
    return cache_dir() / "bin" / f"{component.name}-{component.version(tools_dir)}"


def binary_path(binary: str, tools_dir: Path = TOOLS_DIR) -> Path:
    """Where `binary` (e.g. "kube-apiserver") lives in the cache; it may not be built yet."""
    for component in COMPONENTS:
        if binary in component.binaries:
            return component_dir(component, tools_dir) / binary
    known = sorted(b for c in COMPONENTS for b in c.binaries)
    raise KeyError(f"unknown control-plane binary {binary!r}; known: {', '.join(known)}")


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PATH", "")
    for extra in GO_FALLBACK_DIRS:
        if extra not in path.split(os.pathsep):
            path = f"{path}{os.pathsep}{extra}" if path else extra
    env["PATH"] = path
    env.setdefault("CGO_ENABLED", "0")
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=mod").strip()
    return env


def is_built(component: Component, tools_dir: Path = TOOLS_DIR) -> bool:
    marker = component.version_marker(tools_dir)
    for binary in component.binaries:
        path = component_dir(component, tools_dir) / binary
        if not os.access(path, os.X_OK):
            return False
        try:
            out = subprocess.run(
                [str(path), *component.version_args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if marker not in out.stdout + out.stderr:
            return False
    return True


def build_command(component: Component, out_dir: Path, tools_dir: Path = TOOLS_DIR) -> list[str]:
    """One `go build` for all of a component's binaries, so shared packages compile once."""
    version = component.version(tools_dir)
    ldflags = ["-s", "-w"]
    if component.name == "kubernetes":
        ldflags += _kubernetes_ldflags(version)
    elif component.name == "helm":
        ldflags.append(f"-X helm.sh/helm/v4/internal/version.version={version}")
    elif component.name == "crane":
        ldflags.append(f"-X github.com/google/go-containerregistry/cmd/crane/cmd.Version={version}")
    elif component.name == "versitygw":
        ldflags.append(f"-X main.Version={version}")
    packages = list(component.binaries.values())
    output = f"{out_dir}/" if len(packages) > 1 else str(out_dir / next(iter(component.binaries)))
    return ["nice", "-n", "10", "go", "build", "-trimpath", "-ldflags", " ".join(ldflags), "-o", output, *packages]


def build(component: Component, tools_dir: Path = TOOLS_DIR, force: bool = False) -> float | None:
    """Build one component unless it is already cached; returns seconds spent, None if skipped."""
    if not force and is_built(component, tools_dir):
        return None
    if shutil.which("go", path=go_env()["PATH"]) is None:
        raise RuntimeError("`go` not found on PATH or in /usr/local/go/bin; install Go >= 1.26")
    final = component_dir(component, tools_dir)
    staging = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    cmd = build_command(component, staging, tools_dir)
    result = subprocess.run(cmd, cwd=tools_dir / component.tools_subdir, env=go_env())
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(
            f"building {component.name} failed (exit {result.returncode}): "
            f"cd {tools_dir / component.tools_subdir} && {' '.join(cmd)}"
        )
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    if not is_built(component, tools_dir):
        raise RuntimeError(f"{component.name} built but its binaries do not report {component.version(tools_dir)}")
    return time.monotonic() - started


def build_all(names: list[str] | None = None, force: bool = False, tools_dir: Path = TOOLS_DIR) -> int:
    selected = [c for c in COMPONENTS if not names or c.name in names]
    unknown = set(names or ()) - {c.name for c in COMPONENTS}
    if unknown:
        print(f"unknown component(s) {sorted(unknown)}; choose from {[c.name for c in COMPONENTS]}",
              file=sys.stderr)
        return 2
    total = time.monotonic()
    for component in selected:
        where = component_dir(component, tools_dir)
        print(f"control plane: {component.name} {component.version(tools_dir)} -> {where}", flush=True)
        spent = build(component, tools_dir, force)
        print(f"  {'cached' if spent is None else f'built in {spent:.1f} s'}", flush=True)
    print(f"control plane: ready in {time.monotonic() - total:.1f} s", flush=True)
    return 0


def main() -> int:
    return build_all(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
