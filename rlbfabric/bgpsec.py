"""How fabric BGP sessions protect themselves, from the fabric file's [fabric] table, for every
fabric kind that runs BGP:

    ttl_security = true                          # GTSM (RFC 5082): only a directly attached peer
    bgp_password_file = "/etc/rlb/bgp-password"  # TCP MD5 (RFC 2385) with this shared secret

GTSM is on by default. TCP MD5 is on when the password file exists (it is read when bird's
configuration is rendered; the rendered file is then written readable by root only); "" turns it
off. bird 2.0.12 does both on unnumbered, dynamic (neighbor range) sessions; it has no TCP-AO.
Route filters and prefix limits are not options: every session imports only what its peer may
announce (rlbfabric/bird/conf.py), as FRR's and Junos's data-centre guides set them."""
from __future__ import annotations

import os
from dataclasses import dataclass

from rlbcommon.secretfile import SecretFileError, read_secret

from .errors import FabricError

DEFAULT_PASSWORD_FILE = "/etc/rlb/bgp-password"
# BGP graceful restart (RFC 4724), `graceful_restart_s` in [fabric]: how long peers keep a
# restarting switch's routes. Sized to a bird restart (systemd's 1 s, a start, sessions up and
# converged: 1-3 s measured here, more with a full table), not longer: the window is also how
# long a switch whose bird stays down keeps attracting traffic by its stale routes. A switch that
# hangs whole (carrier up, nothing forwarded) is not left to it: its neighbours' heartbeats take
# it out within half a second (rlbswitch/heartbeat.py).
GRACEFUL_RESTART_S = 10
# BGP hold time, `bgp_hold_s` in [fabric] (keepalives every third of it, at least 1 s): fast, as a
# fabric's timers are (BFD and carrier loss find most faults sooner); RFC 4271's least is 3 s.
# Emulated VMs that stall for seconds need more (the VM lab's RLB_BGP_HOLD_S).
HOLD_S = 3
MD5_MAX_KEY = 80            # TCP_MD5SIG_MAXKEYLEN


@dataclass
class BgpSecurity:
    ttl_security: bool = True
    password_file: str = DEFAULT_PASSWORD_FILE
    password: str | None = None       # given directly (labs generate one per lab)
    hold_s: int = HOLD_S              # sessions' hold time; keepalives every third of it

    @property
    def keepalive_s(self) -> int:
        return max(1, self.hold_s // 3)

    def secret(self) -> str | None:
        """The MD5 password, or None when sessions run without one."""
        if self.password is not None:
            return check_password(self.password, "the lab's password")
        if not self.password_file or not os.path.exists(self.password_file):
            return None
        try:
            text = read_secret(self.password_file, "BGP password file")
        except SecretFileError as e:
            raise FabricError(str(e)) from None
        return check_password(text, self.password_file) if text else None


def check_password(text: str, where: str) -> str:
    if len(text.encode()) > MD5_MAX_KEY or any(c in text for c in '"\\\n\r') or not text.isprintable():
        raise FabricError(f"{where}: a BGP password is 1-{MD5_MAX_KEY} printable characters without "
                          f"quotes or backslashes")
    return text


def parse(f: dict, where: str) -> BgpSecurity:
    ttl = f.get("ttl_security", True)
    if not isinstance(ttl, bool):
        raise FabricError(f"{where}: ttl_security must be true or false")
    pw = f.get("bgp_password_file", DEFAULT_PASSWORD_FILE)
    if not isinstance(pw, str):
        raise FabricError(f"{where}: bgp_password_file must be a path (or \"\" for none)")
    hold = f.get("bgp_hold_s", HOLD_S)
    if not isinstance(hold, int) or isinstance(hold, bool) or not HOLD_S <= hold <= 65535:
        raise FabricError(f"{where}: bgp_hold_s {hold!r}: seconds, {HOLD_S} to 65535 (RFC 4271)")
    return BgpSecurity(ttl, pw, hold_s=hold)
