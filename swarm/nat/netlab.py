"""Homes behind NAT routers and an "internet", built from Linux network namespaces.

For tests and benchmarks of the public swarm (docs/operations.md, "Behind NAT"). Everything
lives in namespaces this module creates, named with one random prefix, so nothing touches the
host's own interfaces, and `close()` removes every namespace (their interfaces, routes and
iptables rules go with them).

    internet namespace: a bridge, 10.77.0.0/16
      ├── public host namespace "pub": 10.77.0.2 (a bootstrap, a client, a public peer)
      ├── router namespace of home i: WAN 10.77.(10+i).1, MASQUERADE, only replies come in
      │     └── host namespace of home i: 192.168.(100+i).2, default route via its router
      └── (add_host(own_subnet=True)) host k on a link of its own, routed: 10.77.(100+k%150).x

Each home's WAN address is in a /24 of its own, as on the internet: limits per IP group
(peer/admission.py) see one group per home, and another for the public host.

A home's host can dial the internet; nobody outside can dial into a home. The addresses are
private ranges on purpose: reachability must be decided by dial-backs, never by address class.
Needs root, `ip` (iproute2) and `iptables`; `available()` says whether they are here.

A home's link can be made slower: `shape` caps its upload (tc tbf), and `delay_home` adds a
one-way delay to every TCP connection its host opens (this kernel has no netem): the router
redirects them to a small proxy of ours in its namespace (`python -m hexswarm.swarm.nat.netlab
delay PORT MS`), which reads each connection's original destination, connects there, and
forwards each chunk both ways `MS` milliseconds after it arrived. `add_host` puts more hosts on
the internet with no NAT, and `delay_host` delays every connection such a host opens to another
(its own proxy, whose connections are marked so they pass): a WAN without NAT, where every
round trip between two hosts is twice the delay (benchmarks/wan.py); `per_destination` gives
some destinations other delays (a WAN whose hosts are in different regions, benchmarks/wan_routes.py).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

INTERNET_PREFIX = "10.77.0"
PUBLIC_HOST_IP = f"{INTERNET_PREFIX}.2"
INTERNET_GATEWAY = f"{INTERNET_PREFIX}.1"  # the internet namespace's own address, once it routes
CLONE_NEWNET = 0x40000000


class NetLabError(RuntimeError):
    pass


def available() -> str | None:
    """None when namespaces can be built here, else why not (for a loud skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"hxprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Home:
    """One home: a host behind its own NAT router."""

    index: int
    host_ns: str
    router_ns: str
    host_ip: str
    wan_ip: str


@dataclass
class NetLab:
    """The namespaces of one test; use as a context manager so they are always removed."""

    homes: int = 3
    prefix: str = field(default_factory=lambda: f"hx{secrets.token_hex(2)}")
    namespaces: list[str] = field(default_factory=list)
    home_list: list[Home] = field(default_factory=list)
    routing: bool = False  # the internet's namespace routes hosts with a subnet of their own

    @property
    def internet_ns(self) -> str:
        return f"{self.prefix}-inet"

    @property
    def public_ns(self) -> str:
        return f"{self.prefix}-pub"

    def __enter__(self) -> NetLab:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self) -> None:
        atexit.register(self.close)  # an interrupted run still removes what it made
        self._add_ns(self.internet_ns)
        self._run(self.internet_ns, "ip link add br0 type bridge")
        self._run(self.internet_ns, "ip link set br0 up")
        self._add_ns(self.public_ns)
        self._plug_into_internet(self.public_ns, "pub", f"{PUBLIC_HOST_IP}/16")
        for i in range(1, self.homes + 1):
            self.home_list.append(self._build_home(i))

    def home(self, i: int) -> Home:
        """Home number i, from 1."""
        return self.home_list[i - 1]

    def exec_prefix(self, ns: str) -> tuple[str, ...]:
        """What to put before a command to run it inside namespace `ns`."""
        return ("ip", "netns", "exec", ns)

    def shape(self, ns: str, device: str, rate_mbit: float) -> None:
        """Caps what leaves `device` in `ns` with a token bucket (tc tbf): a home link's upload."""
        burst_kbit = max(32, int(rate_mbit * 10))  # >= one 10 ms slice of the rate
        self._run(
            ns,
            f"tc qdisc replace dev {device} root tbf rate {rate_mbit}mbit burst {burst_kbit}kbit latency 400ms",
        )

    def delay_home(self, i: int, one_way_ms: float, port: int = 7070) -> subprocess.Popen:
        """Adds `one_way_ms` each way to every TCP connection home i's host opens (its router
        redirects them to a delay proxy); the proxy dies with the namespaces."""
        home = self.home(i)
        self._run(
            home.router_ns, f"iptables -t nat -A PREROUTING -i lan0 -p tcp -j REDIRECT --to-ports {port}"
        )
        return self._start_delay_proxy(home.router_ns, one_way_ms, port)

    def _start_delay_proxy(
        self,
        ns: str,
        one_way_ms: float,
        port: int,
        mark: int = 0,
        per_destination: dict[str, float] | None = None,
    ) -> subprocess.Popen:
        args = [*self.exec_prefix(ns), sys.executable, "-m", "hexswarm.swarm.nat.netlab", "delay"]
        args += [str(port), str(one_way_ms), str(mark)]
        if per_destination:
            args.append(",".join(f"{ip}={ms}" for ip, ms in per_destination.items()))
        proxy = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        if proxy.stdout.readline().strip() != b"ready":
            raise NetLabError(f"the delay proxy in {ns} did not start")
        return proxy

    def add_host(self, k: int, own_subnet: bool = False) -> tuple[str, str]:
        """Another host on the internet with no NAT in front: (its namespace, its address
        10.77.0.(2 + k)). Host 0 is the public host. With `own_subnet`, its address is in a /24
        of its own as most hosts on the internet are, 10.77.(100 + k % 150).(2 + k // 150) (so
        limits per IP group see one group per host, up to 150 hosts), and the internet's
        namespace routes to it instead of bridging it (`_route_into_internet`)."""
        most = 600 if own_subnet else 200
        if not 1 <= k <= most:
            raise NetLabError(f"host number {k} is outside 1..{most}")
        ns = f"{self.prefix}-w{k}"
        self._add_ns(ns)
        if own_subnet:
            ip = f"10.77.{100 + k % 150}.{2 + k // 150}"
            self._route_into_internet(ns, f"w{k}", ip)
        else:
            ip = f"{INTERNET_PREFIX}.{2 + k}"
            self._plug_into_internet(ns, f"w{k}", f"{ip}/16")
        return ns, ip

    def delay_host(
        self,
        ns: str,
        own_ip: str,
        one_way_ms: float,
        port: int = 7070,
        per_destination: dict[str, float] | None = None,
    ) -> subprocess.Popen:
        """Adds `one_way_ms` each way to every TCP connection the host in `ns` opens to another
        host (an OUTPUT redirect to a delay proxy in its own namespace, whose own connections
        carry DELAY_MARK and pass), or `per_destination[ip]` to those going to `ip`;
        connections to itself are not delayed."""
        self._run(ns, f"iptables -t nat -A OUTPUT -p tcp -d {own_ip} -j RETURN")
        self._run(
            ns,
            f"iptables -t nat -A OUTPUT -p tcp -d {INTERNET_PREFIX[:-2]}.0.0/16 -m mark ! --mark {DELAY_MARK} "
            f"-j REDIRECT --to-ports {port}",
        )
        return self._start_delay_proxy(ns, one_way_ms, port, DELAY_MARK, per_destination)

    def close(self) -> None:
        for ns in reversed(self.namespaces):
            _kill_processes_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()

    # --- building blocks

    def _build_home(self, i: int) -> Home:
        router, host = f"{self.prefix}-r{i}", f"{self.prefix}-h{i}"
        wan_ip, lan = f"10.77.{10 + i}.1", f"192.168.{100 + i}"
        self._add_ns(router)
        self._add_ns(host)
        self._plug_into_internet(router, f"r{i}", f"{wan_ip}/16")
        self._run(None, f"ip link add {self.prefix}l{i} type veth peer name {self.prefix}L{i}")
        self._run(None, f"ip link set {self.prefix}l{i} netns {router} name lan0")
        self._run(None, f"ip link set {self.prefix}L{i} netns {host} name eth0")
        self._run(router, f"ip addr add {lan}.1/24 dev lan0")
        self._run(router, "ip link set lan0 up")
        self._run(host, f"ip addr add {lan}.2/24 dev eth0")
        self._run(host, "ip link set eth0 up")
        self._run(host, f"ip route add default via {lan}.1")
        self._run(router, "sysctl -qw net.ipv4.ip_forward=1")
        # The home router: out through MASQUERADE, in only what answers a connection from inside.
        self._run(router, "iptables -t nat -A POSTROUTING -o wan0 -j MASQUERADE")
        self._run(router, "iptables -P FORWARD DROP")
        self._run(router, "iptables -A FORWARD -i lan0 -o wan0 -j ACCEPT")
        self._run(
            router, "iptables -A FORWARD -i wan0 -o lan0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
        )
        self._run(router, "iptables -A INPUT -i wan0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT")
        self._run(router, "iptables -A INPUT -i wan0 -j DROP")
        return Home(i, host, router, f"{lan}.2", wan_ip)

    def _plug_into_internet(self, ns: str, tag: str, cidr: str) -> None:
        outside = self._link_to_internet(ns, tag, cidr)
        self._run(self.internet_ns, f"ip link set {outside} master br0")

    def _route_into_internet(self, ns: str, tag: str, ip: str) -> None:
        """A host on a link of its own to the internet's namespace, which routes its address:
        the host's neighbour table holds the gateway only. The kernel's neighbour (ARP) table is
        shared by every namespace (1,024 entries by default, net.ipv4.neigh.default.gc_thresh3),
        so N hosts on one bridge, each talking to all the others, overflow it at ~32 hosts:
        "neighbor table overflow" in the kernel's log, and the next host's dials fail. Routed,
        N hosts take ~2N entries. Bridged hosts reach routed ones by proxy ARP on br0."""
        if not self.routing:
            self._run(self.internet_ns, f"ip addr add {INTERNET_GATEWAY}/16 dev br0")
            self._run(self.internet_ns, "sysctl -q -w net.ipv4.ip_forward=1")  # this namespace's own
            self._run(self.internet_ns, "sysctl -q -w net.ipv4.conf.br0.proxy_arp=1")
            self.routing = True
        outside = self._link_to_internet(ns, tag, f"{ip}/32")
        self._run(self.internet_ns, f"ip route add {ip}/32 dev {outside}")
        self._run(ns, f"ip route add default via {INTERNET_GATEWAY} dev wan0 onlink")

    def _link_to_internet(self, ns: str, tag: str, cidr: str) -> str:
        """A veth pair from the internet's namespace to `ns` (there `wan0`, holding `cidr`), both
        ends up; returns the name of the internet's end."""
        outside, inside = f"{self.prefix}{tag}o", f"{self.prefix}{tag}i"
        self._run(None, f"ip link add {outside} type veth peer name {inside}")
        self._run(None, f"ip link set {outside} netns {self.internet_ns}")
        self._run(self.internet_ns, f"ip link set {outside} up")
        self._run(None, f"ip link set {inside} netns {ns} name wan0")
        self._run(ns, f"ip addr add {cidr} dev wan0")
        self._run(ns, "ip link set wan0 up")
        return outside

    def _add_ns(self, ns: str) -> None:
        self._run(None, f"ip netns add {ns}")
        self.namespaces.append(ns)
        self._run(ns, "ip link set lo up")

    def _run(self, ns: str | None, command: str) -> None:
        args = command.split()
        if ns is not None:
            args = [*self.exec_prefix(ns), *args]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise NetLabError(f"{' '.join(args)}: {done.stderr.strip()}")


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """Runs the calling thread inside namespace `ns` for a while: processes it starts meanwhile
    (a client's DHT child and its p2pd) live there for good, while the test process itself
    talks to them over Unix sockets in /tmp, which no network namespace separates. Abstract
    Unix sockets are per namespace: a helper started meanwhile that uses one (torch's
    shared-memory manager) is lost once the thread leaves, so start such helpers first."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/thread-self/ns/net") as home, open(f"/var/run/netns/{ns}") as target:
        if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise NetLabError(f"setns into {ns}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            libc.setns(home.fileno(), CLONE_NEWNET)


def _kill_processes_in(ns: str) -> None:
    """SIGKILLs whatever still runs inside `ns` (a test that failed before its own cleanup)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


# --- the delay proxy (runs inside a router's namespace)

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h: where a REDIRECTed connection was going
SO_MARK = 36  # asm-generic/socket.h: the firewall mark of a socket's packets
DELAY_MARK = 0x77  # a host's delay proxy marks its own connections so they are not redirected again


async def _serve_delay(
    port: int, default_s: float, mark: int = 0, per_destination_s: dict | None = None
) -> None:
    import asyncio

    async def forward(reader, writer, one_way_s: float) -> None:
        """Forwards each chunk `one_way_s` after it arrived, in order, until either side ends."""
        queue: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            while data := await reader.read(1 << 16):
                queue.put_nowait((asyncio.get_running_loop().time() + one_way_s, data))
            queue.put_nowait((asyncio.get_running_loop().time() + one_way_s, b""))

        async def write() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(read(), write(), return_exceptions=True)

    async def accepted(reader, writer) -> None:
        raw = writer.get_extra_info("socket").getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        destination = (socket.inet_ntoa(raw[4:8]), struct.unpack(">H", raw[2:4])[0])
        try:
            upstream = await _connect(destination, mark)
        except OSError:
            writer.close()
            return
        one_way_s = (per_destination_s or {}).get(destination[0], default_s)
        await asyncio.gather(
            forward(reader, upstream[1], one_way_s),
            forward(upstream[0], writer, one_way_s),
            return_exceptions=True,
        )

    server = await asyncio.start_server(accepted, "0.0.0.0", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


async def _connect(destination: tuple[str, int], mark: int):
    """A connection to `destination`, its packets marked with `mark` (0: unmarked)."""
    import asyncio

    if not mark:
        return await asyncio.open_connection(*destination)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, destination)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


if __name__ == "__main__":  # python -m hexswarm.swarm.nat.netlab delay PORT MS [MARK [IP=MS,...]]
    import asyncio

    if len(sys.argv) not in (4, 5, 6) or sys.argv[1] != "delay":
        sys.exit("usage: python -m hexswarm.swarm.nat.netlab delay PORT ONE_WAY_MS [MARK [IP=MS,...]]")
    mark = int(sys.argv[4]) if len(sys.argv) >= 5 else 0
    pairs = (item.split("=") for item in sys.argv[5].split(",")) if len(sys.argv) == 6 else ()
    per_destination = {ip: float(ms) / 1000 for ip, ms in pairs}
    asyncio.run(_serve_delay(int(sys.argv[2]), float(sys.argv[3]) / 1000, mark, per_destination))
