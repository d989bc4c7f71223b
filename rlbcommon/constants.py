"""Every fabric-wide constant, in one place: what all agents, configs and labs must agree on."""
from __future__ import annotations

import os
from pathlib import Path

U32_MAX = 2**32 - 1                 # the widest weight or counter a map field holds
# How a switch turns a prefix's BGP paths into a route (rlbfabric/policy/compiler.py).
POLICIES = ("dpf", "fare", "ecmp", "dlb", "spray")
ROCE_PORT = 4791                    # RoCEv2's UDP destination port (IANA)
METRICS_PORT = {"switch": 9471, "host": 9472, "coordinator": 9473}
COORDINATOR_PORT = METRICS_PORT["coordinator"]   # the coordinator's API and /metrics share it
VERBS_GROUP = "rlb-verbs"            # the users whose jobs may use the verbs socket (`rlbhost verbs install` makes it)
VERBS_PORT = 4798                   # host agents agree on verbs QPs' paths (UDP, between base addresses)
# Their datagrams' traffic class: DSCP CS6 (network control, as BGP and BFD are sent), so a fabric
# can queue them apart from the data they place; in the default class they are dropped first when
# a link is full of RoCE, and a QP being set up then keeps its addresses (nopeer).
VERBS_TCLASS = 48 << 2
# Colour k travels as the generic ext community (COLOUR_COMMUNITY, k): transitive, type 0x03,
# sub-type 0x0b (RFC 9012's colour extended community).
COLOUR_COMMUNITY = 0x030B0000
# FARE's path bandwidth: what a leaf originates, "a maximum bandwidth value" (float32's largest).
MAX_BANDWIDTH = 3.4e38
# Runtime files (bird includes, sockets, locks, layouts); RLB_RUN_DIR moves them (tests, labs).
RUN_DIR = Path(os.environ.get("RLB_RUN_DIR", "/run/rlb"))
# What a machine learns once and keeps across reboots (what its kernel's verifier accepts);
# RLB_STATE_DIR moves it.
STATE_DIR = Path(os.environ.get("RLB_STATE_DIR", "/var/lib/rlb"))
