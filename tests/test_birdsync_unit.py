"""The bird follower's bookkeeping that needs no bird: includes whose configure failed are given
to bird again."""
from __future__ import annotations

import pytest

from rlbfabric.bird.ctl import BirdError
from rlbswitch.birdwatch import restarted
from rlbswitch.includes import BirdIncludes


class FlakyBird:
    def __init__(self):
        self.calls = 0

    def configure(self) -> str:
        self.calls += 1
        if self.calls == 1:
            raise BirdError("bird control socket: Connection refused")
        return "Reconfigured"


def test_an_include_whose_configure_failed_is_configured_again(tmp_path):
    incs = BirdIncludes(FlakyBird())
    inc = tmp_path / "l1.neighbors.conf"
    assert incs.write(inc, "protocol bgp s1 ...\n")
    with pytest.raises(BirdError):
        incs.configure("neighbours", inc)
    # the same content is on disk, but bird never read it: written and configured again
    assert incs.write(inc, "protocol bgp s1 ...\n")
    incs.configure("neighbours", inc)
    assert incs.bird.calls == 2
    assert not incs.write(inc, "protocol bgp s1 ...\n")
    assert inc.read_text() == "protocol bgp s1 ...\n"


def test_a_bird_whose_printed_start_time_drifts_has_not_restarted():
    """Seen in the VM lab: bird prints its start time from its monotonic clock and the wall
    clock, so one bird's start time moved by 22 ms back and forth between reads and the switch
    agent held its routes as if bird had restarted, every second. Only a later start is a new bird."""
    assert not restarted("2026-11-23 06:02:02.586", "2026-11-23 06:02:02.564")
    assert not restarted("2026-11-23 06:02:02.564", "2026-11-23 06:02:02.586")
    assert restarted("2026-11-23 06:02:02.586", "2026-11-23 07:09:40.120")
    assert restarted("", "2026-11-23 07:09:40.120") and restarted("garbled", "other")
    assert not restarted("2026-11-23 06:02:02.586", "2026-11-23 06:02:02.586")
