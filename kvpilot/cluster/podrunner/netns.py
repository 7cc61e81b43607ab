"""Network namespaces for pods: one veth pair per pod, its host end on the bridge `kvpilot0`.

Needs root (CAP_NET_ADMIN). The pod end is `eth0` with the pod's IP; the bridge holds the pod
network's gateway address, so the host (the gateway's nginx, Prometheus, the operator's probes)
reaches every pod IP directly, and each pod keeps its own loopback (the sidecar reads the engine's
stats feed on 127.0.0.1:8001, as in a real pod).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess

BRIDGE = "kvpilot0"


class NetnsError(RuntimeError):
    """An `ip` command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def unavailable() -> str | None:
    """Why pod network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the pod runner needs root (network namespaces and veth pairs need CAP_NET_ADMIN)"
    if _ip("-V", check=False).returncode != 0:
        return "the `ip` command (iproute2) is missing"
    return None


def ensure_bridge(cidr: str) -> bool:
    """Create the bridge with the gateway address of `cidr` (e.g. 198.18.0.1/16); True if created."""
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        return False
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", cidr, "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    return True


def delete_bridge() -> None:
    _ip("link", "del", BRIDGE, check=False)


def names(uid: str) -> tuple[str, str]:
    """(netns, host veth) for a pod uid; interface names stay under 15 characters."""
    short = uid.replace("-", "")[:10]
    return f"kvp-{short}", f"kvh{short}"


def create(netns: str, veth: str, pod_ip: str, cidr: str) -> None:
    """The pod's namespace: lo up, eth0 = pod_ip on the pod network, default route via the bridge."""
    network = ipaddress.ip_interface(cidr)
    delete(netns, veth)
    _ip("netns", "add", netns)
    peer = "kvc" + veth[3:]
    _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
    _ip("link", "set", peer, "netns", netns)
    _ip("-n", netns, "link", "set", peer, "name", "eth0")
    _ip("-n", netns, "addr", "add", f"{pod_ip}/{network.network.prefixlen}", "dev", "eth0")
    _ip("-n", netns, "link", "set", "lo", "up")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "route", "add", "default", "via", str(network.ip))
    _ip("link", "set", veth, "master", BRIDGE)
    _ip("link", "set", veth, "up")


def delete(netns: str, veth: str) -> None:
    """Remove the namespace and the veth pair (either may already be gone)."""
    _ip("netns", "delete", netns, check=False)
    _ip("link", "del", veth, check=False)


def exec_prefix(netns: str) -> list[str]:
    """argv prefix that runs a command inside the namespace (`ip netns exec` execs, same PID)."""
    return ["ip", "netns", "exec", netns]
