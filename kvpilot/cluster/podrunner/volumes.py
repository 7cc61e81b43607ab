"""A pod's volumes on the local fleet: configMap and secret volumes as host directories, and the
container paths under their mounts mapped onto them.

The kubelet bind-mounts each volume at its `mountPath` inside the container's mount namespace.
The pod runner's processes share the host's file system (only the network is namespaced), so it
writes each volume into the pod's state directory and rewrites the command arguments and
environment values that name a path under a mount (`/etc/x/f`, or `--flag=/etc/x/f`) to the host
copy. Processes that build such paths at run time from pieces would not be rewritten; kvpilot's own
commands take every path as an argument. emptyDir mounts are scratch space and stay unmapped: the
processes write where the path points on the host (so a host model path under a mount like /tmp
still resolves); so do projected volumes (the service account token the API server adds to pods
that do not opt out: no pod runner process talks to the API server). Two exceptions, for the
storage initializer (kvpilot/storage): an emptyDir that an init container mounts is how it hands
files to the containers after it, so it gets a directory of the pod's own and is mapped like a
configMap; a hostPath volume is mapped to its host path (created for DirectoryOrCreate).
persistentVolumeClaim and the rest are refused by name.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

PASSED_BY = ("emptyDir", "projected")  # mounts left as host paths (but an init container's emptyDir)
SUPPORTED = ("configMap", "secret", "hostPath", *PASSED_BY)
PROJECTED = ("configMap", "secret")  # written to the host and mapped; emptyDir is left as the host path


class VolumeUnavailable(RuntimeError):
    """A volume whose source does not exist (yet): the pod waits, as the kubelet's does."""


class UnsupportedVolume(ValueError):
    """A volume or mount the local pod runner cannot provide."""


def volume_kind(volume: Mapping[str, Any]) -> str:
    return next((k for k in volume if k != "name"), "unknown")


def _safe_relative(path: str, what: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise UnsupportedVolume(f"{what} {path!r} must be a relative path inside the volume, without '..'")
    return rel


def source_name(volume: Mapping[str, Any]) -> str:
    """The ConfigMap's or Secret's name a configMap / secret volume projects."""
    kind = volume_kind(volume)
    return str(volume[kind].get("name" if kind == "configMap" else "secretName"))


def projected_files(volume: Mapping[str, Any], source: Mapping[str, Any] | None) -> dict[str, tuple[bytes, int]]:
    """relative path -> (content, mode) of a configMap or secret volume, as the kubelet projects it:
    every key, or only `items` (key -> path, each its own mode); a missing source or key refuses
    unless the volume is optional."""
    kind = volume_kind(volume)
    spec, name = volume[kind], source_name(volume)
    optional = bool(spec.get("optional"))
    what = "configmap" if kind == "configMap" else "secret"
    if source is None:
        if optional:
            return {}
        raise VolumeUnavailable(f'{what} "{name}" not found (volume {volume["name"]!r})')
    if kind == "secret":  # a Secret's data is base64 on the wire
        data = {k: base64.b64decode(v) for k, v in (source.get("data") or {}).items()}
    else:
        data = {k: str(v).encode() for k, v in (source.get("data") or {}).items()}
        data |= {k: base64.b64decode(v) for k, v in (source.get("binaryData") or {}).items()}
    mode = int(spec.get("defaultMode", 0o644))
    items = spec.get("items")
    if not items:
        return {str(_safe_relative(k, "key")): (v, mode) for k, v in data.items()}
    out = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise VolumeUnavailable(f'{what} "{name}" has no key {item["key"]!r} (volume {volume["name"]!r})')
        out[str(_safe_relative(item["path"], "item path"))] = (data[item["key"]], int(item.get("mode", mode)))
    return out


def init_mounted(pod_spec: Mapping[str, Any]) -> set[str]:
    """Names of the volumes an init container mounts (what it writes there, the containers read)."""
    return {m["name"] for c in pod_spec.get("initContainers") or () for m in c.get("volumeMounts") or ()}


def materialize(
    volumes: Sequence[Mapping[str, Any]], root: Path, read: Callable[[str, str], Mapping[str, Any] | None],
    shared: set[str] | frozenset[str] = frozenset(),
) -> dict[str, Path]:  # fmt: skip
    """Write the pod's configMap and secret volumes under `root` (one directory each); volume name ->
    directory. Files get the volume's modes (the runner's processes run as the user who owns them).
    emptyDirs named in `shared` (init_mounted) get an empty directory of their own; hostPath volumes
    are their host path. Other kinds are left out: `mount_table` passes emptyDir and projected mounts
    by and refuses the rest."""
    out: dict[str, Path] = {}
    for volume in volumes:
        kind, directory = volume_kind(volume), root / volume["name"]
        if kind == "hostPath":
            host = Path(str(volume["hostPath"]["path"]))
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                host.mkdir(parents=True, exist_ok=True)
            elif not host.exists():
                raise VolumeUnavailable(f'hostPath {host} does not exist (volume {volume["name"]!r})')
            out[volume["name"]] = host
            continue
        if kind == "emptyDir" and volume["name"] in shared:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            out[volume["name"]] = directory
            continue
        if kind not in PROJECTED:
            continue
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        # `read(kind, name)`: the ConfigMap or Secret object, None where there is none
        for rel, (content, mode) in projected_files(volume, read(kind, source_name(volume))).items():
            path = directory / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(mode)
        out[volume["name"]] = directory
    return out


def mount_table(container: Mapping[str, Any], volumes: Sequence[Mapping[str, Any]],
                dirs: Mapping[str, Path]) -> list[tuple[str, str]]:  # fmt: skip
    """(mountPath, host path) of a container's mounts, longest mount path first (the most specific wins)."""
    kinds = {v["name"]: volume_kind(v) for v in volumes}
    table = []
    for mount in container.get("volumeMounts") or []:
        name = mount["name"]
        if kinds.get(name) in PASSED_BY and name not in dirs:
            continue
        if name not in dirs:
            kind = kinds.get(name)
            why = f"is a {kind} volume" if kind else "is not a volume of the pod"
            raise UnsupportedVolume(f"container {container.get('name')!r} mounts {name!r}, which {why}; the local "
                                    f"pod runner provides {', '.join(SUPPORTED)} volumes")  # fmt: skip
        host = dirs[name]
        if mount.get("subPath"):
            host = host / _safe_relative(mount["subPath"], "subPath")
        table.append((str(PurePosixPath(mount["mountPath"])), str(host)))
    return sorted(table, key=lambda m: len(m[0]), reverse=True)


def rewrite(text: str, mounts: Sequence[tuple[str, str]]) -> str:
    """`text` with a leading container path (or the value of `--flag=path`) under a mount mapped to the host."""
    head, eq, value = text.partition("=") if text.startswith("-") else ("", "", text)
    for mount, host in mounts:
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return head + eq + host + value[len(mount) :]
    return text
