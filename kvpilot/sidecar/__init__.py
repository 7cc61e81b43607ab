"""The Prometheus exporter that runs beside the engine in each pod."""
