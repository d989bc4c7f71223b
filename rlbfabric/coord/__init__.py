"""The fabric coordinator: the service and its HTTP API (service), Prometheus (metrics), the
rlbcoord command (cli)."""
