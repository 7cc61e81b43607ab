"""Certificates and keys for a loopback-only control plane, made with the openssl CLI.

One CA signs the apiserver's serving certificate (valid for 127.0.0.1, localhost and the
in-cluster service names), an admin client certificate in `system:masters` and the aggregation
layer's front-proxy client certificate; a separate RSA key pair signs service-account tokens. Nothing here is meant to leave the machine.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVING_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local")
SERVING_IPS = ("127.0.0.1", "10.0.0.1")  # loopback and the first address of the service range
DAYS = "30"
FRONT_PROXY_CN = "front-proxy-client"


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files."""

    dir: Path

    ca_cert = property(lambda self: self.dir / "ca.crt")
    ca_key = property(lambda self: self.dir / "ca.key")
    serving_cert = property(lambda self: self.dir / "apiserver.crt")
    serving_key = property(lambda self: self.dir / "apiserver.key")
    admin_cert = property(lambda self: self.dir / "admin.crt")
    admin_key = property(lambda self: self.dir / "admin.key")
    # The aggregation layer's client certificate: the API server proxies to extension API servers
    # (e.g. a metrics adapter) with it, and they trust the user it names (requestheader auth).
    front_proxy_cert = property(lambda self: self.dir / "front-proxy-client.crt")
    front_proxy_key = property(lambda self: self.dir / "front-proxy-client.key")
    sa_key = property(lambda self: self.dir / "sa.key")
    sa_pub = property(lambda self: self.dir / "sa.pub")


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def _signed(pki: Pki, name: str, subject: str, extensions: str) -> None:
    (pki.dir / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=pki.dir)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", DAYS, "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=pki.dir)


def generate(directory: Path) -> Pki:
    """Create a fresh CA, serving and admin certificates and the service-account key pair."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the `openssl` command is missing; install Debian's openssl package")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = Pki(directory)
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", DAYS, "-subj", "/CN=kvpilot-local-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=directory)
    alt_names = ",".join([*(f"DNS:{n}" for n in SERVING_NAMES), *(f"IP:{ip}" for ip in SERVING_IPS)])
    _signed(pki, "apiserver", "/CN=kube-apiserver",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={alt_names}\n")
    _signed(pki, "admin", "/O=system:masters/CN=kvpilot-admin",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n")
    _signed(pki, "front-proxy-client", f"/CN={FRONT_PROXY_CN}",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n")
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return pki
