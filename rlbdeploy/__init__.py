"""What an operator installs, rendered from the fabric file: the systemd units and boot-time link
setup of every role (units), Prometheus' scrape configuration (scrape), the keys each pair of
machines shares (hostkeys), and the `rlbfabric` command that writes them, with the etcd
identities and certificates the coordinator's package issues (cli)."""
