"""The HTTP layer under every route: ASGI middleware, connection limits, body guards and error rendering."""
