"""The routes and the two apps that serve them: the OpenAI-compatible API and the stats feed."""
