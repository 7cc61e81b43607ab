"""The probe gate against an engine started with an API key: it sends the key, or fails saying why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kvpilot.operator.analysis.probes import Endpoint, ScoringError, probes_from_configmap, score_track
from tests.service.conftest import DEFAULT_FLAGS, ServerProcess

pytestmark = pytest.mark.service

PROBES = probes_from_configmap(yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "probe-set.yaml")
                                              .read_text()))[:2]


def test_probes_send_the_key_or_fail_clearly(start_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("probe-key-123\n")
    server = start_server(*DEFAULT_FLAGS, "--api-key-file", str(key_file))
    endpoint = Endpoint(server.base_url, {})
    with pytest.raises(ScoringError, match=r"wants an API key \(none was sent\).*spec\.engine\.apiKeySecretRef"):
        score_track(endpoint, PROBES)
    with pytest.raises(ScoringError, match="the one sent was refused"):
        score_track(endpoint, PROBES, api_key="wrong")
    assert score_track(endpoint, PROBES, api_key="probe-key-123") < 0  # a mean log-likelihood
