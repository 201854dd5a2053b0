"""Where a local cluster listens: loopback hosts from ``--host-base``, ports from ``--port-base``.

The harness's options, but the plan is the launchers' (``broker.localgroup`` lays broker
groups out from one), so it sits below both.

Without a port base every port is one the OS just handed out (``free_port``), which is what
tests want. With one, ports are handed out in order from the base and each is checked free
before it is used, so that two runs on one machine can be given disjoint ranges and a
clash is reported as such (which port, which option) instead of as a broker that failed to
bind. Hosts stay within 127.0.0.0/8: the harness never listens beyond loopback.
"""

from __future__ import annotations

import ipaddress
import socket

from common.process import free_port

#: highest port a plan may reach (the base plus everything a run needs must stay below it)
MAX_PORT = 65535
#: lowest port base accepted: below it are the system's well-known ports
MIN_PORT_BASE = 1024
#: ports one plan may hand out at most (bounds the search, catches a runaway caller)
MAX_PORTS_PER_PLAN = 2048
DEFAULT_HOST_BASE = "127.0.0.1"


class PortPlanError(ValueError):
    """A host or port base that cannot be used (not loopback, out of range, a port taken)."""


def parse_host_base(text: str) -> ipaddress.IPv4Address:
    """A loopback IPv4 address with room for a few hosts after it, or a clear error."""
    try:
        addr = ipaddress.IPv4Address(text.strip())
    except ValueError:
        raise PortPlanError(f"--host-base {text!r} is not an IPv4 address") from None
    if not addr.is_loopback:
        raise PortPlanError(f"--host-base {text}: the harness listens on loopback only (127.0.0.0/8)")
    if int(addr) & 0xFF == 0 or int(addr) & 0xFF > 250:
        raise PortPlanError(f"--host-base {text}: the last byte must be 1..250 (nodes take the next few)")
    return addr


def parse_addresses(text: str) -> tuple[str, int | None]:
    """``--addresses HOST[:PORT]``: the host base and (optionally) the port base in one option."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = text.strip(), ""
    parse_host_base(host)
    if not port:
        return host, None
    if not port.isdigit():
        raise PortPlanError(f"--addresses {text!r}: the port after ':' must be a number")
    return host, check_port_base(int(port))


def check_port_base(base: int) -> int:
    if not MIN_PORT_BASE <= base <= MAX_PORT - 64:
        raise PortPlanError(f"--port-base {base} is outside {MIN_PORT_BASE}..{MAX_PORT - 64}")
    return base


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class PortPlan:
    """Hands out the hosts and ports of one local cluster.

    ``host(i)`` is the base host plus ``i``. ``port(host)`` is a free port: the OS's choice
    without a base, else the next one from the base (one counter for all hosts, so a run's
    ports form one contiguous range whatever host they sit on). ``block(host, n)`` is ``n``
    consecutive free ports, for a broker's fast channel, which RocketMQ puts at main - 2.
    """

    def __init__(self, host_base: str = DEFAULT_HOST_BASE, port_base: int | None = None) -> None:
        self.host_base = parse_host_base(host_base)
        self.port_base = None if port_base is None else check_port_base(port_base)
        self.next_port = self.port_base
        self.handed_out = 0

    def host(self, i: int) -> str:
        return str(self.host_base + i)

    @property
    def span(self) -> tuple[int, int] | None:
        """The first and last port handed out from the base (None without a base or before any)."""
        if self.port_base is None or self.next_port == self.port_base:
            return None
        assert self.next_port is not None
        return self.port_base, self.next_port - 1

    def port(self, host: str) -> int:
        return self.block(host, 1)

    def block(self, host: str, n: int) -> int:
        """The first of ``n`` consecutive ports on ``host``, all free a moment ago."""
        self.handed_out += n
        if self.handed_out > MAX_PORTS_PER_PLAN:
            raise PortPlanError(f"a local cluster asked for more than {MAX_PORTS_PER_PLAN} ports")
        if self.next_port is None:
            return self._os_block(host, n)
        first = self.next_port
        if first + n - 1 > MAX_PORT:
            raise PortPlanError(f"--port-base {self.port_base}: the run needs ports beyond {MAX_PORT}")
        for p in range(first, first + n):
            if not port_is_free(host, p):
                raise PortPlanError(
                    f"port {host}:{p} is in use (--port-base {self.port_base} gives this run "
                    f"{self.port_base} upwards); choose another base"
                )
        self.next_port = first + n
        return first

    def _os_block(self, host: str, n: int) -> int:
        for _ in range(200):
            last = free_port(host)
            first = last - n + 1
            if first > MIN_PORT_BASE and all(port_is_free(host, p) for p in range(first, last + 1)):
                return first
        raise PortPlanError(f"no {n} consecutive free ports on {host}")
