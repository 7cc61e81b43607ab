"""Pure: listeners and upstreams -> one nginx configuration file (Debian's nginx-light suffices).

Per listener, one `map` on the Host and the matched headers picks the entry (regexes in Gateway API
precedence order), and per entry a `split_clients` on `$request_id` picks a backend by weight; the winner names an `upstream` of the
Service's ready endpoints. Entries with nothing to serve answer 404 (no route), 500 (invalid
backendRef, as the Gateway API asks) or 503 (no ready endpoint).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvpilot.cluster.gateway import UPSTREAM_HEADER
from kvpilot.cluster.gateway.model import Backend, Listener, MatchEntry, Upstream

METRICS_LOG = "metrics.log"
ERRORS = {404: "no HTTPRoute rule matches this request",
          500: "the chosen backendRef is invalid (see the HTTPRoute's status)",
          503: "the chosen backend has no ready endpoint"}


def _ident(*parts: object) -> str:
    return "_".join(re.sub(r"[^a-z0-9]+", "_", str(p).lower()).strip("_") for p in parts)


def upstream_name(namespace: str, service: str, port: int) -> str:
    return "kvp_u_" + _ident(namespace, service, port)


def percentages(weights: Sequence[int]) -> list[float]:
    """Weights -> percentages with two decimals (nginx's split_clients precision) summing to 100."""
    total = sum(weights)
    cumulative, out, acc = 0, [], 0.0
    for w in weights:
        cumulative += w
        edge = round(cumulative * 10000 / total)
        out.append((edge - acc) / 100)
        acc = edge
    return out


def _target(backend: Backend, upstreams: Mapping[tuple[str, str, int], Upstream]) -> str:
    """The upstream's name, or `kvp_error_<code>_<upstream>`: the error still names its backend (metrics)."""
    name = upstream_name(backend.namespace, backend.name, backend.port)
    if backend.error is not None:
        return f"kvp_error_{backend.error}_{name}"
    up = upstreams.get((backend.namespace, backend.name, backend.port))
    if up is None or not up.servers:
        return f"kvp_error_503_{name}"
    return name


def backend_targets(listeners: Sequence[Listener]) -> dict[str, tuple[str, str]]:
    """Every `$kvp_target` value the render can produce for a backend -> (namespace, Service)."""
    out: dict[str, tuple[str, str]] = {}
    for lst in listeners:
        for entry in lst.entries:
            for b in entry.backends:
                name = upstream_name(b.namespace, b.name, b.port)
                for target in (name, *[f"kvp_error_{code}_{name}" for code in (500, 503)]):
                    out[target] = (b.namespace, b.name)
    return out


def _literal(value: str) -> str:
    """A header value (letters, digits, ._:/+=@,- only: route_check) as a PCRE literal."""
    return "".join(f"[{ch}]" if ch in ".+" else ch for ch in value)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _entry_value(entry: MatchEntry, var: str, upstreams: Mapping[tuple[str, str, int], Upstream],
                 out: list[str]) -> str:
    """The map value for one entry: an upstream name, an error marker or a split_clients variable."""
    backends = [b for b in entry.backends if b.weight > 0]
    if not backends:
        return "kvp_error_500"  # no backendRef, or all weights 0: the Gateway API asks for a 500
    targets = [_target(b, upstreams) for b in backends]
    if len(set(targets)) == 1:
        return targets[0]
    out.append(f'split_clients "${{request_id}}" ${var} {{  # {entry.route}')
    shares = percentages([b.weight for b in backends])
    for i, (target, share) in enumerate(zip(targets, shares, strict=True)):
        if i == len(targets) - 1:
            out.append(f"    * {target};")
        elif share > 0:
            out.append(f"    {share:.2f}% {target};")
    out.append("}")
    return f"${var}"


def _host_pattern(host: str | None) -> str:
    """A PCRE for nginx's `$host` (lowercase, no port): exact, `*.` wildcard (one or more labels) or any."""
    if host is None:
        return "[^|]*"
    if host.startswith("*."):
        return "[^|]+[.]" + _literal(host[2:])
    return _literal(host)


def _listener(lst: Listener, index: int, upstreams: Mapping[tuple[str, str, int], Upstream],
              out: list[str]) -> None:
    """One `map` per listener on "$host|$http_<h1>|$http_<h2>..." (every header any entry matches):
    each entry is a regex in precedence order (nginx tries regexes in order, the first match wins)."""
    base = f"kvp_l{index}"
    names = sorted({name.lower() for e in lst.entries for name, _ in e.headers})
    source = "|".join(["$host", *[f"$http_{n.replace('-', '_')}" for n in names]])
    lines = []
    for j, e in enumerate(lst.entries):
        value = _entry_value(e, f"{base}_e{j}", upstreams, out)
        wanted = {name.lower(): v for name, v in e.headers}
        parts = [_host_pattern(e.host), *[_literal(wanted[n]) if n in wanted else "[^|]*" for n in names]]
        lines.append(f"    {_quote('~^' + '[|]'.join(parts) + '$')} {value};  # {e.route}")
    out.append(f"map {_quote(source)} ${base} {{  # {lst.gateway} {lst.name}")
    out += lines
    out.append("    default kvp_error_404;")
    out.append("}")
    out += [
        f"server {{  # Gateway {lst.gateway}, listener {lst.name}",
        f"    listen {lst.address}:{lst.port};",
        f"    set $kvp_target ${base};",
        *[f'    if ($kvp_target ~ ^kvp_error_{code}) {{ return {code} "{text}\\n"; }}'
          for code, text in ERRORS.items()],
        "    location / {",
        "        proxy_pass http://$kvp_target;",
        "    }",
        "}",
    ]


def render(listeners: Sequence[Listener], upstreams: Mapping[tuple[str, str, int], Upstream],
           prefix: Path, run_as_root: bool) -> str:
    """The whole nginx.conf; `prefix` holds the pid file, logs and temp dirs."""
    out = [
        "# generated by kvpilot's local gateway (kvpilot/cluster/gateway); do not edit",
        "user root;" if run_as_root else "",
        "worker_processes 1;",
        f"pid {prefix / 'nginx.pid'};",
        f"error_log {prefix / 'error.log'} warn;",
        "events { worker_connections 1024; }",
        "http {",
        f"    access_log {prefix / 'access.log'};",
        # One line per request for the controller's per-backend counters (metrics.py); only with a
        # server that sets $kvp_target (nginx refuses an unknown variable in log_format).
        "    log_format kvp_metrics '$kvp_target $status';" if listeners else "",
        f"    access_log {prefix / METRICS_LOG} kvp_metrics;" if listeners else "",
        f"    client_body_temp_path {prefix / 'tmp' / 'body'};",
        f"    proxy_temp_path {prefix / 'tmp' / 'proxy'};",
        "    client_body_buffer_size 1m;",
        "    client_max_body_size 16m;",
        # A new client connection per request: a reload never races a reused idle connection.
        "    keepalive_timeout 0;",
        "    proxy_http_version 1.1;",
        '    proxy_set_header Connection "";',
        "    proxy_set_header Host $host;",
        "    proxy_buffering off;",
        "    proxy_request_buffering off;",
        "    proxy_read_timeout 300s;",
        "    proxy_next_upstream error timeout;",
        f"    add_header {UPSTREAM_HEADER} $upstream_addr always;",
    ]
    body: list[str] = []
    used: set[tuple[str, str, int]] = set()
    for i, lst in enumerate(listeners):
        _listener(lst, i, upstreams, body)
        used |= {(b.namespace, b.name, b.port) for e in lst.entries for b in e.backends}
    for ukey in sorted(used):
        up = upstreams.get(ukey)
        if up is None or not up.servers:
            continue
        body.append(f"upstream {upstream_name(*ukey)} {{")
        body += [f"    server {s} max_fails=1 fail_timeout=2s;" for s in up.servers]
        body += ["    keepalive 16;", "}"]
    out += ["    " + line if line else "" for line in body]
    out.append("}")
    return "\n".join(line for line in out if line != "") + "\n"
