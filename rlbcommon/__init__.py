"""Code shared by the switch and host agents: loading BPF programs, pinned-map access,
BPF test runs, packet building, namespaces and metrics. Nothing agent-specific lives here."""
