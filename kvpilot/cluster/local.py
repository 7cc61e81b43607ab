"""`LocalCluster`: a real Kubernetes control plane on loopback with fake GPU nodes.

    from kvpilot.cluster.local import LocalCluster
    cluster = LocalCluster(Path(".cache/cluster"), nodes=2)
    cluster.start()            # etcd, kube-apiserver, controller-manager, scheduler, kwok; ~seconds
    cluster.kubeconfig         # Path of an admin kubeconfig (client certificate in system:masters)
    cluster.server             # "https://127.0.0.1:<port>"
    cluster.node_names         # ["kvpilot-gpu-0", "kvpilot-gpu-1"]
    cluster.stop()             # SIGTERM then SIGKILL every process by PID; removes the state dir
    LocalCluster.load(dir).stop()   # stop a cluster another process started (`kvpilot cluster down`)
    LocalCluster(dir, die_with_parent=True)  # processes get SIGTERM if this Python process dies

Binaries come from `kvpilot cluster build` (kvpilot.cluster.build). Everything listens on
127.0.0.1 on free ports; the state dir holds certificates, etcd's data, logs/<process>.log and
state.json (PIDs, ports). Nodes carry `nvidia.com/gpu` capacity, the labels in
kvpilot.cluster.nodes and KWOK's annotation, so KWOK marks them Ready and runs their pods.
The controller-manager runs the default controllers (garbage collector, namespace, deployment,
replicaset, job, service-account ...); there is no kubelet, no kube-proxy, no cloud provider.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from kvpilot.cluster import build, pki, processes
from kvpilot.cluster import nodes as fake_nodes
from kvpilot.cluster import prometheus as local_prometheus
from kvpilot.cluster.api import ApiClient

STAGES_FILE = Path(__file__).with_name("kwok_stages.yaml")
SERVICE_CIDR = "10.0.0.0/24"
# KWOK hands out pod IPs from here (the benchmarking range, 198.18.0.0/15, clashes with no real
# network); the pod runner puts real processes behind them (kvpilot.cluster.podrunner).
POD_CIDR = "198.18.0.1/16"
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# The local fleet on top (`start_fleet`): real processes behind pods, and the gateway stand-in.
FLEET = {"kvpilot-podrunner": "kvpilot.cluster.podrunner", "kvpilot-gateway": "kvpilot.cluster.gateway",
         "prometheus": ""}
FLEET_STOP_GRACE_S = 40.0  # the runner stops every engine (each up to 10 s, all at once)
# Every default controller runs. kube-controller-manager 1.37 has no in-tree cloud controllers
# left to disable, and node IPAM stays off because --allocate-node-cidrs is false.
CONTROLLERS = "*"
# Fake nodes heartbeat through their Lease (kwok renews it every quarter of its duration) and
# report status only every ~5 minutes, like a kubelet with node leases: at 500 nodes that is ~10
# Lease writes/s, not ~60. A CPU-starved kwok may renew late, so the node controller waits 5
# minutes before calling a node NotReady (its default, 50 s, let 34 of 500 nodes flap under load).
NODE_LEASE_S = 200
NODE_GRACE_S = 300


class LocalCluster:
    """A loopback control plane whose processes and files live under `state_dir`."""

    def __init__(self, state_dir: Path, nodes: int = 2, node_spec: fake_nodes.GpuNodeSpec | None = None,
                 start_timeout_s: float = 180.0, die_with_parent: bool = False) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.num_nodes = nodes
        self.node_spec = node_spec or fake_nodes.GpuNodeSpec()
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self.pids: dict[str, int] = {}
        self.binaries: dict[str, str] = {}
        self.ports: dict[str, int] = {}
        self.server = ""
        self.started_in_s: float | None = None

    # ---- paths ---------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> pki.Pki:
        return pki.Pki(self.state_dir / "pki")

    @property
    def node_names(self) -> list[str]:
        return [fake_nodes.node_name(i) for i in range(self.num_nodes)]

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    # ---- life cycle ----------------------------------------------------------------------
    @staticmethod
    def missing_binaries() -> list[str]:
        """Binaries `start()` needs that `kvpilot cluster build` has not produced yet."""
        return [b for b in ORDER if not os.access(build.binary_path(b), os.X_OK)]

    def start(self) -> None:
        """Start every component, wait for readiness and create the GPU nodes; stop all on failure."""
        missing = self.missing_binaries()
        if missing:
            raise FileNotFoundError(
                f"control-plane binaries not built: {', '.join(missing)}; run `kvpilot cluster build`")
        if (self.state_dir / "state.json").exists():
            raise RuntimeError(f"a cluster state already exists in {self.state_dir}; stop it first "
                               f"(`kvpilot cluster down --state-dir {self.state_dir}`)")
        began = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(began)
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - began
        self._save()

    def _start(self, began: float) -> None:
        deadline = began + self.start_timeout_s
        left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
        keys = pki.generate(self.state_dir / "pki")
        names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
        self.ports = dict(zip(names, processes.free_ports(len(names)), strict=True))
        self.server = f"https://127.0.0.1:{self.ports['kube-apiserver']}"
        self._write_kubeconfig(keys)

        self._spawn("etcd", self._etcd_args())
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}/health"
        self._wait("etcd", lambda: processes.http_ok(etcd_url, expect='"health":"true"'), left())

        self._spawn("kube-apiserver", self._apiserver_args(keys))
        tls = processes.client_tls(keys.ca_cert, keys.admin_cert, keys.admin_key)
        self._wait("kube-apiserver", lambda: processes.http_ok(f"{self.server}/readyz", tls), left())

        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._spawn(name, self._component_args(name, keys))
        self._save()
        insecure = processes.unverified_tls()
        for name in ("kube-controller-manager", "kube-scheduler"):
            url = f"https://127.0.0.1:{self.ports[name]}/healthz"
            self._wait(name, lambda url=url: processes.http_ok(url, insecure), left())
        kwok_url = f"http://127.0.0.1:{self.ports['kwok']}/healthz"
        self._wait("kwok", lambda: processes.http_ok(kwok_url), left())

        api = self.api()
        for name in self.node_names:
            api.create_node(fake_nodes.gpu_node(name, self.node_spec))
        self._wait("fake GPU nodes Ready", lambda: all(api.node_ready(n) for n in self.node_names), left(),
                   log_of="kwok")
        self._wait("service account default/default",
                   lambda: api.exists("/api/v1/namespaces/default/serviceaccounts/default"), left(),
                   log_of="kube-controller-manager")

    def start_fleet(self, gateway: bool = True, pod_runner: bool = True, prometheus: bool = True,
                    scrape_interval: str = "1s") -> None:
        """Start the pod runner (real processes behind pods of namespaces named `fleet-*`; needs
        root), the gateway stand-in (nginx serving the
        HTTPRoutes of Gateways of class `kvpilot-local`) and a Prometheus scraping the running
        pods (`prometheus_url`). docs/dev/local-fleet.md."""
        wanted = {"kvpilot-podrunner": pod_runner, "kvpilot-gateway": gateway, "prometheus": prometheus}
        for name, on in wanted.items():
            if not on or processes.is_alive(self.pids.get(name, -1), self.binaries.get(name)):
                continue
            if name == "prometheus":
                self.ports["prometheus"] = processes.free_ports(1)[0]
                argv = local_prometheus.argv(self.state_dir, self.ports["prometheus"], scrape_interval)
            else:
                argv = [sys.executable, "-m", FLEET[name], "--state-dir", str(self.state_dir)]
            proc = processes.spawn(argv, self.log_path(name), self.die_with_parent)
            self.pids[name], self.binaries[name] = proc.pid, argv[0]
            self._save()
        if prometheus:
            self._wait("prometheus", lambda: processes.http_ok(f"{self.prometheus_url}/-/ready"), 60)
        for name in (n for n, on in wanted.items() if on and n != "prometheus"):
            time.sleep(0.5)
            if not processes.is_alive(self.pids[name], sys.executable):  # died at once: bad flags, no root
                raise RuntimeError(f"{name} exited during start-up{processes._log_tail(self.log_path(name))}")

    def restart_apiserver(self, down_s: float = 0.0) -> float:
        """Stop kube-apiserver (SIGTERM), keep it down `down_s`, start it again on the same port with
        the same etcd, and wait for /readyz; returns the seconds it was unreachable. Clients and
        the other components must reconnect by themselves (fault tests, issue 22)."""
        began = time.monotonic()
        processes.terminate(self.pids["kube-apiserver"], self.binaries.get("kube-apiserver"))
        time.sleep(down_s)
        keys = self.pki
        self._spawn("kube-apiserver", self._apiserver_args(keys))
        tls = processes.client_tls(keys.ca_cert, keys.admin_cert, keys.admin_key)
        self._wait("kube-apiserver", lambda: processes.http_ok(f"{self.server}/readyz", tls), self.start_timeout_s)
        return time.monotonic() - began

    @property
    def prometheus_url(self) -> str:
        """The fleet's Prometheus (after `start_fleet`)."""
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    def stop(self) -> None:
        """Stop every process this cluster started (by PID, reverse order) and delete the files it
        wrote; the state dir itself goes only if nothing else is left in it."""
        for name in (*FLEET, *reversed(ORDER)):
            pid = self.pids.pop(name, None)
            if pid is not None:
                grace = FLEET_STOP_GRACE_S if name == "kvpilot-podrunner" else 10.0
                processes.terminate(pid, self.binaries.get(name), grace_s=grace)
        from kvpilot.cluster.podrunner.runner import cleanup_leftovers

        cleanup_leftovers(self.state_dir)
        nginx_pid = self.state_dir / "gateway" / "nginx.pid"
        with contextlib.suppress(OSError, ValueError):  # nginx outlived a killed gateway controller
            pid = int(nginx_pid.read_text().strip())
            if "nginx" in processes.cmdline(pid):
                processes.terminate(pid)
        for entry in ("pki", "etcd", "logs", "kube-controller-manager", "kube-scheduler", "gateway", "pods",
                      "prometheus"):
            shutil.rmtree(self.state_dir / entry, ignore_errors=True)
        for entry in ("kubeconfig", "state.json", "state.json.tmp"):
            (self.state_dir / entry).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()

    @classmethod
    def load(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in `state_dir/state.json` (to stop it or print its kubeconfig)."""
        state_file = Path(state_dir).resolve() / "state.json"
        if not state_file.exists():
            raise FileNotFoundError(f"no cluster state in {state_file.parent}; start one with `kvpilot cluster up`")
        state = json.loads(state_file.read_text())
        cluster = cls(state_file.parent, nodes=state["nodes"])
        cluster.pids, cluster.binaries = state["pids"], state["binaries"]
        cluster.ports, cluster.server = state["ports"], state["server"]
        return cluster

    def running(self) -> dict[str, bool]:
        return {name: processes.is_alive(pid, self.binaries.get(name)) for name, pid in self.pids.items()}

    def api(self) -> ApiClient:
        keys = self.pki
        return ApiClient(self.server, processes.client_tls(keys.ca_cert, keys.admin_cert, keys.admin_key))

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- internals -----------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        binary = str(build.binary_path(name))
        proc = processes.spawn([binary, *args], self.log_path(name), self.die_with_parent)
        self.pids[name], self.binaries[name] = proc.pid, binary
        self._save()

    def _wait(self, what: str, check: Any, timeout_s: float, log_of: str | None = None) -> None:
        """Wait for `check`; failures quote the log of `log_of` (default: the process named `what`)."""
        name = log_of or what
        processes.wait_until(check, what, timeout_s, self.pids.get(name),
                             self.log_path(name) if name in self.pids else None)

    def _save(self) -> None:
        state = {"nodes": self.num_nodes, "pids": self.pids, "binaries": self.binaries, "ports": self.ports,
                 "server": self.server, "kubeconfig": str(self.kubeconfig), "started_in_s": self.started_in_s}
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / "state.json")

    def _write_kubeconfig(self, keys: pki.Pki) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kvpilot",
            "clusters": [{"name": "kvpilot", "cluster": {"server": self.server,
                                                          "certificate-authority": str(keys.ca_cert)}}],
            "users": [{"name": "kvpilot-admin", "user": {"client-certificate": str(keys.admin_cert),
                                                          "client-key": str(keys.admin_key)}}],
            "contexts": [{"name": "kvpilot", "context": {"cluster": "kvpilot", "user": "kvpilot-admin",
                                                          "namespace": "default"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        return ["--name=kvpilot", f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=kvpilot={peer}", "--unsafe-no-fsync=true", "--log-level=warn"]

    def _apiserver_args(self, keys: pki.Pki) -> list[str]:
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            # A loopback advertise address is refused by the endpoint reconciler; nothing runs
            # in-cluster that needs the `kubernetes` Service endpoints, so none is kept.
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.ports['kube-apiserver']}", f"--cert-dir={self.state_dir / 'pki'}",
            f"--tls-cert-file={keys.serving_cert}", f"--tls-private-key-file={keys.serving_key}",
            f"--client-ca-file={keys.ca_cert}",
            f"--service-account-key-file={keys.sa_pub}", f"--service-account-signing-key-file={keys.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=RBAC",
            "--allow-privileged=true", "--profiling=false", "--v=1",
            # The aggregation layer, for extension API servers such as a metrics adapter (HPAs):
            # requests are proxied with the front-proxy certificate, straight to the Service's
            # endpoints (no kube-proxy here to reach a cluster IP).
            f"--requestheader-client-ca-file={keys.ca_cert}", f"--requestheader-allowed-names={pki.FRONT_PROXY_CN}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={keys.front_proxy_cert}", f"--proxy-client-key-file={keys.front_proxy_key}",
            "--enable-aggregator-routing=true",
        ]

    def _component_args(self, name: str, keys: pki.Pki) -> list[str]:
        kubeconfig = str(self.kubeconfig)
        if name == "kwok":
            return [f"--config={STAGES_FILE}", f"--kubeconfig={kubeconfig}", "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={fake_nodes.KWOK_ANNOTATION}={fake_nodes.KWOK_ANNOTATION_VALUE}",
                    f"--cidr={POD_CIDR}", "--node-ip=127.0.0.1", f"--node-lease-duration-seconds={NODE_LEASE_S}",
                    f"--server-address=127.0.0.1:{self.ports['kwok']}"]
        common = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                  f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                  f"--secure-port={self.ports[name]}", f"--cert-dir={self.state_dir / name}",
                  "--leader-elect=false", "--profiling=false", "--v=1"]
        if name == "kube-scheduler":
            return common
        return [*common, f"--service-account-private-key-file={keys.sa_key}", f"--root-ca-file={keys.ca_cert}",
                f"--cluster-signing-cert-file={keys.ca_cert}", f"--cluster-signing-key-file={keys.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--use-service-account-credentials=false",
                f"--controllers={CONTROLLERS}", f"--node-monitor-grace-period={NODE_GRACE_S}s",
                # Its default 20 requests/s caps a burst of 1,000 Deployments (ReplicaSet, pod,
                # status and Event writes, ~8 each) at about 7 minutes; the API server is local.
                "--kube-api-qps=200", "--kube-api-burst=400"]

