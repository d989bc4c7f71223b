#!/bin/bash
# Vagrant's provisioner for one lab VM (runs as root inside it):
#   provision.sh NODE FABRIC [SETUP OPTION...]
# the options go to `python -m rlblab.vm.node setup` as they are (the Vagrantfile's SETUP_OPTIONS:
# --xdp, --bfd-ms, ...; `python -m rlblab.vm.node setup --help` lists them).
# Dependencies come pre-installed in the local box (build-box.sh); on a public Debian 12 box they
# are installed from the network here. Then the project (editable, from the synced source) and
# the node's role: NIC names, bird2, the switch or host agent, rxe0, Prometheus/Grafana.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: provision.sh NODE FABRIC [SETUP OPTION...]" >&2
    exit 2
fi
node=$1 fabric=$2
shift 2
src=/opt/rlb/src venv=/opt/rlb/venv
if [ ! -x $venv/bin/python ]; then
    echo "provision: $node: installing dependencies from the network (public box)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends $(grep -v '^#' $src/vagrant/box/packages.txt)
    /usr/bin/python3 -m venv --system-site-packages $venv
fi
if [ -d /opt/rlb/wheels ]; then offline=(--no-index --find-links /opt/rlb/wheels); else offline=(); fi
# the local box's venv has them already (from its wheels); a public box's come from PyPI; either
# way the list is the synced source's (and the venv's setuptools 66, without PEP 639, is upgraded)
$venv/bin/pip install -q "${offline[@]}" --upgrade -r $src/vagrant/box/requirements.txt
$venv/bin/pip install -q "${offline[@]}" --no-deps --no-build-isolation -e $src
if ! modinfo rdma_rxe >/dev/null 2>&1; then
    echo "provision: $node: kernel $(uname -r) has no rdma_rxe (a cloud kernel?):" \
         "apt-get install linux-image-amd64, reboot, vagrant provision $node" >&2
fi
cd /
$venv/bin/python -m rlblab.vm.node setup --fabric "$src/$fabric" --node "$node" "$@"
systemctl reset-failed    # the boot-time ifup of unconfigured NICs fails harmlessly
echo "provision: $node ready"
