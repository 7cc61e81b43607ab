"""`kvpilot serve`: the engine behind an OpenAI-compatible HTTP API, plus the stats feed."""

from kvpilot.engine.server.app import create_app
from kvpilot.engine.server.runtime import ServerRuntime, ServerSettings
from kvpilot.engine.server.stats_server import create_stats_app

__all__ = ["ServerRuntime", "ServerSettings", "create_app", "create_stats_app"]
