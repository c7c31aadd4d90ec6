"""Watching a server's process tree for network connections beyond the machine.

A submission must serve from its own files and the model: a launcher that calls out to
another API at evaluation time (a bigger model behind the task's name, a cache somewhere
else) is catalogue item 11. The evaluation's server shares the host's network (the harness
must reach its port), so the harness watches it instead: every ``interval_s`` it lists the
sockets of each process descended from the server's leader (``/proc/PID/fd`` links to
``socket:[INODE]``, looked up in that process's ``/proc/PID/net/{tcp,tcp6,udp,udp6}``) and
records any whose remote end is not a loopback address (TCP connected or connecting; UDP
connected). Linux only; elsewhere it watches nothing and says so.

What it cannot see: a connection opened and closed between two polls. The interval is
short against an API call's round trip, and a launcher that calls out per request does so
hundreds of times in an evaluation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TCP_STATES = {"01": "established", "02": "connecting"}
"""The TCP states (ESTABLISHED, SYN_SENT) of a socket with a remote end."""
TREE_EVERY = 10
"""Polls between two walks of the process table for the tree's members."""


@dataclass(frozen=True, slots=True)
class Connection:
    pid: int
    command: str
    protocol: str
    remote: str
    state: str

    def text(self) -> str:
        return f"{self.command} (pid {self.pid}) {self.state} {self.protocol} to {self.remote}"


def _decode_address(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # /proc prints IPv6 as four little-endian 32-bit words
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(words))
    return ip, int(port, 16)


def is_local(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return bool((mapped or addr).is_loopback or (mapped or addr).is_unspecified)


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in (PROC / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    return inodes


def outside_connections(pid: int) -> list[Connection]:
    """The sockets of ``pid`` whose remote end is beyond the machine."""
    inodes = _socket_inodes(pid)
    if not inodes:
        return []
    try:
        command = (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return []
    found = []
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = (PROC / str(pid) / "net" / protocol).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[9] not in inodes:
                continue
            state = cols[3]
            if protocol.startswith("tcp"):
                if state not in TCP_STATES:
                    continue
                label = TCP_STATES[state]
            else:
                label = "sending"
            ip, port = _decode_address(cols[2])
            if port == 0 or is_local(ip):
                continue
            remote = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            found.append(Connection(pid, command, protocol.rstrip("6"), remote, label))
    return found


@dataclass(slots=True)
class EgressWatch:
    """Polls a process tree until cancelled; :attr:`seen` holds each distinct connection.
    ``root`` gives the tree's leader, or None while there is none yet (a server not yet
    started, or started again on another port)."""

    root: Callable[[], int | None]
    interval_s: float = 0.1
    seen: dict[tuple[str, str], Connection] = field(default_factory=dict)
    polls: int = 0
    tree: list[int] = field(default_factory=list)
    leader: int | None = None

    def poll(self) -> None:
        leader = self.root()
        if leader is None:
            return
        if leader != self.leader or self.polls % TREE_EVERY == 0:
            self.leader, self.tree = leader, descendants(leader)
        self.polls += 1
        for pid in self.tree:
            for c in outside_connections(pid):
                self.seen.setdefault((c.command, c.remote), c)

    async def run(self) -> None:
        if not PROC.joinpath("self", "net", "tcp").exists():
            return
        while True:
            await asyncio.to_thread(self.poll)
            await asyncio.sleep(self.interval_s)
