#!/bin/bash
# Start or stop libvirtd + virtlogd by hand, inside their own network namespace, for machines
# where PID 1 is not systemd (containers, CI). Every bridge, dnsmasq and VM network of the lab
# then lives in that namespace and nothing touches the host's network; run vagrant there too:
#
#   vagrant/libvirt.sh start            # netns rlbvm, daemons, the default storage pool
#   ip netns exec rlbvm vagrant up      # (from vagrant/)
#   vagrant/libvirt.sh stop
#
# On a normal machine with systemd, use `systemctl start libvirtd` and plain `vagrant` instead.
set -euo pipefail
ns=${RLB_VM_NETNS:-rlbvm}
case ${1:-} in
start)
    ip netns list | grep -qw "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up     # the VMs' UDP link tunnels run over the namespace's loopback
    mkdir -p /var/lib/libvirt/images
    # Without udev nobody gives /dev/kvm its group and mode (udev's rule: kvm, 0660), so the
    # QEMU user cannot open it. libvirt then finds its cached QEMU capabilities stale on every
    # call (KVM recorded one way, usable the other) and probes QEMU again, forever: `vagrant up`
    # defines the domains and never starts them. Do what udev would.
    if [ -c /dev/kvm ] && getent group kvm >/dev/null; then
        chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
    fi
    if ! [ -f /run/virtlogd.pid ] || ! kill -0 "$(cat /run/virtlogd.pid)" 2>/dev/null; then
        ip netns exec "$ns" virtlogd -d
    fi
    if ! [ -f /run/libvirtd.pid ] || ! kill -0 "$(cat /run/libvirtd.pid)" 2>/dev/null; then
        ip netns exec "$ns" libvirtd -d
    fi
    for _ in $(seq 50); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
    if ! virsh -c qemu:///system pool-info default >/dev/null 2>&1; then
        virsh -c qemu:///system pool-define-as default dir --target /var/lib/libvirt/images >/dev/null
        virsh -c qemu:///system pool-start default >/dev/null
        virsh -c qemu:///system pool-autostart default >/dev/null
    fi
    echo "libvirt running in netns $ns: ip netns exec $ns vagrant ..."
    ;;
stop)
    for d in libvirtd virtlogd; do
        if [ -f /run/$d.pid ] && kill "$(cat /run/$d.pid)" 2>/dev/null; then
            for _ in $(seq 50); do kill -0 "$(cat /run/$d.pid 2>/dev/null)" 2>/dev/null || break; sleep 0.1; done
        fi
    done
    ip netns del "$ns" 2>/dev/null || true
    echo "libvirt stopped, netns $ns removed"
    ;;
*)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2 ;;
esac
