"""The local fleet's Prometheus (Debian's `prometheus` package): scrapes what runs in the fleet.

Targets come from file_sd files under `<state dir>/prometheus/`: `pods.json`, written by the pod
runner (every running pod's metrics port, labelled namespace/service/track/pod as a PodMonitor
would), `operator.json`, written by whoever starts an operator (`write_targets`), and `gateway.json`,
written by the gateway stand-in (its per-backend request counts, kvpilot/cluster/gateway/metrics.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROMETHEUS = os.environ.get("KVPILOT_PROMETHEUS", "/usr/bin/prometheus")
JOBS = {"kvpilot-pods": "pods.json", "kvpilot-operator": "operator.json", "kvpilot-gateway": "gateway.json"}


def prometheus_missing() -> str | None:
    if not os.access(PROMETHEUS, os.X_OK):
        return f"{PROMETHEUS} not found: install Debian's prometheus (`apt-get install -y prometheus`)"
    return None


def config(sd_dir: Path, scrape_interval: str = "1s") -> dict[str, Any]:
    """prometheus.yml (as a dict; JSON is valid YAML) with one file_sd job per file in JOBS."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval},
        "scrape_configs": [{"job_name": job, "file_sd_configs": [{"files": [str(sd_dir / name)],
                                                                  "refresh_interval": "1s"}]}
                           for job, name in JOBS.items()],
    }


def argv(state_dir: Path, port: int, scrape_interval: str = "1s") -> list[str]:
    """Write the configuration (and empty target files) and return the command line."""
    sd_dir = state_dir / "prometheus"
    sd_dir.mkdir(parents=True, exist_ok=True)
    for name in JOBS.values():
        if not (sd_dir / name).exists():
            (sd_dir / name).write_text("[]")
    conf = sd_dir / "prometheus.yml"
    conf.write_text(json.dumps(config(sd_dir, scrape_interval), indent=1))
    return [PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={sd_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d", "--log.level=warn"]


def write_targets(state_dir: Path, job_file: str, targets: list[dict[str, Any]]) -> None:
    """Atomically replace one file_sd file, e.g. `operator.json` with
    [{"targets": ["127.0.0.1:9402"], "labels": {"component": "operator"}}]."""
    path = state_dir / "prometheus" / job_file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets, indent=1))
    tmp.replace(path)
