"""Where the programs run: TC clsact egress and ingress of a NIC (replaced in place, so a restart
keeps forwarding), found again in the kernel rather than in a record that could be stale."""
from __future__ import annotations

import contextlib
import logging

from .abi import ECHO, PORTS_MODE, HostError

log = logging.getLogger("rlbhost.dataplane")

TC_EGRESS, TC_INGRESS = 0xFFFFFFF3, 0xFFFFFFF2
TC_PRIO, TC_HANDLE = 0xC0DE, 0x1


def is_ours(tc_filter, echo: bool = True) -> bool:
    """One of this program's filters (echo=False: not the ports' probe echo)."""
    opts = tc_filter.get_attr("TCA_OPTIONS")
    name = (opts.get_attr("TCA_BPF_NAME") or "") if opts is not None else ""
    return tc_filter["handle"] == TC_HANDLE and name.startswith("rlb_host_") and (echo or name != ECHO)


def replace_filter(ipr, idx: int, fn, parent: int):
    """fn on the hook `parent` of interface idx (clsact added if missing, shared with others)."""
    with contextlib.suppress(Exception):   # EEXIST: clsact is shared with others
        ipr.tc("add", "clsact", idx)
    ipr.tc("replace-filter", "bpf", idx, handle=TC_HANDLE, prio=TC_PRIO, fd=fn.fd,
           name=fn.name, parent=parent, classid=1, direct_action=True)


class Hooks:
    """(HostDataplane's) attaching and detaching."""

    def attach(self, ifname: str, path_field: int | None = None, base_value: int | None = None):
        """TC programs on clsact egress and ingress (replaced in place if already there)."""
        idx = self.ifindex(ifname)
        fns = self.load()
        with self.netlink() as ipr:
            for name, parent in (("rlb_host_egress", TC_EGRESS), ("rlb_host_ingress", TC_INGRESS)):
                replace_filter(ipr, idx, fns[name], parent)
        self.sync_paths(ifname, path_field, base_value)
        log.info("attached to %s (TC egress and ingress)", ifname)

    def prepare(self, ifname: str, path_field: int | None = None, base_value: int | None = None):
        """The maps and the paths of ifname without TC programs on it (hosts whose RDMA NICs
        build the packets: QPs are placed through the verbs library only)."""
        self.ifindex(ifname)
        self.load()
        self.sync_paths(ifname, path_field, base_value)
        log.info("following %s without TC programs (verbs only)", ifname)

    def attached_interfaces(self, echo: bool = False) -> list[str]:
        """Interfaces that carry this program (either TC hook; echo: also the ports that carry
        only the probe echo), found in the kernel, not in a record that could be stale. A NIC's
        data plane is on that NIC only (the others carry the same program with their own maps)."""
        if self.nic is not None:
            return [self.nic] if self._has_ours(self.nic, echo) else []
        out = []
        with self.netlink() as ipr:
            for link in ipr.get_links():
                for parent in (TC_EGRESS, TC_INGRESS):
                    try:
                        filters = ipr.get_filters(link["index"], parent=parent)
                    except Exception:      # no clsact on this link
                        continue
                    if any(is_ours(f, echo) for f in filters):
                        out.append(link.get_attr("IFLA_IFNAME"))
                        break
        return out

    def _has_ours(self, ifname: str, echo: bool) -> bool:
        try:
            idx = self.ifindex(ifname)
        except HostError:
            return False
        with self.netlink() as ipr:
            for parent in (TC_EGRESS, TC_INGRESS):
                try:
                    if any(is_ours(f, echo) for f in ipr.get_filters(idx, parent=parent)):
                        return True
                except Exception:          # no clsact on this link
                    continue
        return False

    def detach(self, ifname: str):
        """Remove the programs from ifname (the ports-mode device: also the echo from its
        ports); the pinned state stays, so attaching again adopts it (QPs keep their paths)."""
        idx = self.ifindex(ifname)
        hooks = [(idx, TC_EGRESS), (idx, TC_INGRESS)]
        ports = self._port_ifindexes()
        if ports and idx not in ports:
            hooks += [(p, TC_INGRESS) for p in sorted(ports)]
        with self.netlink() as ipr:
            for i, parent in hooks:
                with contextlib.suppress(Exception):   # a hook without our filter
                    ipr.tc("del-filter", "bpf", i, handle=TC_HANDLE, prio=TC_PRIO, parent=parent)
        log.info("detached from %s%s; pinned state kept", ifname,
                 f" and the probe echo from {len(hooks) - 2} ports" if len(hooks) > 2 else "")

    def _port_ifindexes(self) -> set[int]:
        """Ports mode: the ports' ifindexes, as the paths map has them (none otherwise)."""
        if not self.exists() or not self.maps["config"].get(0).flags & PORTS_MODE:
            return set()
        return {p.ifindex for p in self.paths() if p.ifindex}

    def destroy(self) -> list[str]:
        """Remove the programs from every interface that has them, and every pinned map."""
        gone = self.attached_interfaces(echo=True)
        for ifname in gone:
            self.detach(ifname)
        self.remove_pins()
        log.info("detached%s; pinned state removed", f" from {', '.join(gone)}" if gone else "")
        return gone
