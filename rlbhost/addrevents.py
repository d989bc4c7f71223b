"""Which address events change a host's paths. Every router advertisement refreshes the
lifetimes of the addresses it made, and the kernel announces each refresh as RTM_NEWADDR: with
the fabric's RAs every 3-4 s on every NIC, a GPU server of two NICs heard about one a second and
resynchronised a NIC for each (its addresses, paths, weights and source route: two `ip`
processes every time), for nothing. An address is a path or not by its prefix length and by the
flags that make it unusable (paths.py: tentative, DAD failed, temporary, deprecated); only an
address new, gone, or changed in those is a change."""
from __future__ import annotations

from .dataplane.paths import unusable_flags


class AddressChanges:
    """The addresses seen in events, per interface, with what decides whether each is a path."""

    def __init__(self):
        self.seen: dict[tuple[int, str], tuple[int, int]] = {}   # (ifindex, address) -> (prefixlen, flags)

    def changed(self, msg) -> bool:
        """True when this RTM_NEWADDR or RTM_DELADDR may change the interface's paths (an address
        not seen before counts: what was read at the last resync is not known here)."""
        key = (msg["index"], msg.get_attr("IFA_ADDRESS"))
        if msg["event"] == "RTM_DELADDR":
            self.seen.pop(key, None)
            return True
        state = (msg["prefixlen"], unusable_flags(msg))
        if self.seen.get(key) == state:
            return False                  # a lifetime refreshed: the same path as before
        self.seen[key] = state
        return True

    def forget(self):
        """When the events are followed afresh (at the start, or after the kernel dropped some):
        what was seen before may have changed unheard."""
        self.seen.clear()
