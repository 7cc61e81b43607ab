"""`kvpilot serve`: the engine behind an OpenAI-compatible HTTP API, plus the stats feed."""

from kvpilot.engine.server.endpoints.app import create_app
from kvpilot.engine.server.endpoints.stats_server import create_stats_app
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime
from kvpilot.engine.server.runtime.settings import ServerSettings

__all__ = ["ServerRuntime", "ServerSettings", "create_app", "create_stats_app"]
