"""Monitoring for RLB fabrics: Prometheus scrape configuration and Grafana dashboards, both
generated from code so the queries and the metrics they read stay in one place."""
