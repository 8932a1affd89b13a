"""`streamrl run` picks ports that no outgoing connection can take while the learner starts."""

from __future__ import annotations

import socket

from streamrl.commands.launch import free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(20000 <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
