"""Hosts made of Linux network namespaces (docs/reliability.md, "Hosts"): one bridge in the
test's own namespace, one veth pair per host (its end inside the host is ``eth0`` with an address
of its own in a private /24), and iptables rules inside a host's namespace to cut its links.

Everything is named ``sbh<pid>…`` after the test process that made it, so a run that was killed
leaves names whose pid is dead: :func:`remove_stale` takes those away at the next start. Rules
live in their host's namespace and go with it. Needs root (``ip netns``, iptables); the kernel
here has no ``netem``: delay, stalls and dropped connections are made by a userspace TCP
proxy (``proxy.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

PREFIX = "sbh"
"""Every namespace and link this harness makes starts with this, then the maker's pid."""

IPTABLES = next((name for name in ("iptables-nft", "iptables", "iptables-legacy") if shutil.which(name)), "iptables")


def why_not_available() -> str | None:
    """None when hosts can be made here, else one line saying why not."""
    if os.geteuid() != 0:
        return "the hosts harness needs root (network namespaces, veth pairs, a bridge, iptables)"
    for tool in ("ip", IPTABLES):
        if shutil.which(tool) is None:
            return f"the hosts harness needs {tool!r} on PATH"
    return None


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces and links of earlier runs whose process is gone; what was removed."""
    removed: list[str] = []
    mine = re.compile(rf"^{PREFIX}(\d+)")
    for line in sh("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = mine.match(name)
        if found and not _alive(int(found[1])):
            sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in sh("ip", "-o", "link", "show").stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        found = mine.match(name)
        if found and not _alive(int(found[1])):
            sh("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class Host:
    """One host: a namespace with an address on the bridge."""

    name: str
    netns: str
    address: str
    cut_from: set[str] = field(default_factory=set)

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: list[str], log: IO[bytes], env: dict[str, str] | None = None,
              **options: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, **options)


class Hosts:
    """Hosts on one bridge. Use as a context manager: everything is removed on exit, whatever
    happened (processes are the caller's: stop them first, each by its handle)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.tag = f"{PREFIX}{os.getpid()}"
        # A /24 of 10.231.0.0/16 drawn from the pid: two runs at once take two (pids differ).
        self.net = f"10.231.{os.getpid() % 250 + 1}"
        self.bridge = f"{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self.links: list[str] = []
        self.removed_stale: list[str] = []

    @property
    def gateway_address(self) -> str:
        """The test process's own address on the bridge (it reaches every host)."""
        return f"{self.net}.1"

    def __enter__(self) -> Hosts:
        self.removed_stale = remove_stale()
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            self.links.append(self.bridge)
            sh("ip", "addr", "add", f"{self.gateway_address}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, name: str) -> Host:
        """A new host ``name`` on the bridge, with the next address."""
        index = len(self.hosts) + 1
        netns = f"{self.tag}-{name}"
        outside, inside = f"{self.tag}v{index}", f"{self.tag}p{index}"
        host = Host(name, netns, f"{self.net}.{10 + index}")
        sh("ip", "netns", "add", netns)
        self.hosts[name] = host
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self.links.append(outside)
        sh("ip", "link", "set", inside, "netns", netns)
        sh("ip", "link", "set", outside, "master", self.bridge)
        sh("ip", "link", "set", outside, "up")
        inns = ["ip", "netns", "exec", netns]
        sh(*inns, "ip", "link", "set", "lo", "up")
        sh(*inns, "ip", "link", "set", inside, "name", "eth0")
        sh(*inns, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
        sh(*inns, "ip", "link", "set", "eth0", "up")
        return host

    def cut(self, host: Host, others: list[Host]) -> None:
        """Drop every packet between ``host`` and each of ``others``, both ways (iptables in
        ``host``'s namespace: a connect times out, an open connection goes silent)."""
        for other in others:
            sh(*host.argv([IPTABLES, "-A", "INPUT", "-s", other.address, "-j", "DROP"]))
            sh(*host.argv([IPTABLES, "-A", "OUTPUT", "-d", other.address, "-j", "DROP"]))
            host.cut_from.add(other.name)

    def refuse(self, host: Host, others: list[Host], port: int) -> None:
        """Refuse ``host``'s connections to ``port`` on each of ``others`` with a TCP reset
        (iptables in ``host``'s namespace, removed by :meth:`heal`): it reaches them there only
        through a proxy (``proxy.py``), whatever addresses it learns."""
        for other in others:
            sh(*host.argv([IPTABLES, "-A", "OUTPUT", "-p", "tcp", "-d", other.address, "--dport", str(port),
                           "-j", "REJECT", "--reject-with", "tcp-reset"]))

    def heal(self, host: Host) -> None:
        """Remove every rule of ``host``: its links are whole again."""
        sh(*host.argv([IPTABLES, "-F"]))
        host.cut_from.clear()

    def close(self) -> None:
        """Remove every namespace (their rules and veth ends go with them) and the bridge."""
        for host in self.hosts.values():
            sh("ip", "netns", "del", host.netns, check=False)
        for link in reversed(self.links):
            sh("ip", "link", "del", link, check=False)
        self.hosts.clear()
        self.links.clear()

    def leftovers(self) -> list[str]:
        """This run's namespaces and links still present (after :meth:`close`: none)."""
        names = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.split()]
        links = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link", "show").stdout.splitlines()
                 if len(line.split(":")) > 1]
        return [n for n in names + links if n.startswith(self.tag)]
