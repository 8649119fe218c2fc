"""testbed fault latency|loss|partition|heal|kill|restart, and the emulated WAN `testbed bench --netem` sets
(testbed/bench/netem.py).

Per-node link conditions live in the node's own namespace (testbed/mesh/netns.py), on its egress to the
testbed subnet, in an iptables chain ``am_fault`` hooked from OUTPUT:

* partition A B: ``-d B -j DROP`` in A's namespace and ``-d A -j DROP`` in B's, then the established
  TCP connections between them are aborted (``ss -K``) so both sides see the partition at once rather
  than after the 15 s WebSocket heartbeat.
* latency / loss: this kernel has no ``sch_netem`` (``tc qdisc add ... netem`` says "Specified qdisc kind
  is unknown"), so the testbed does netem's job in user space: ``-o eth0 -d SUBNET -j NFQUEUE
  --queue-bypass`` hands every outgoing packet to a small helper (``python -m testbed.faults delayd``,
  running inside the namespace) that drops it with probability loss and otherwise releases it after
  delay ± jitter (uniform, like netem without a distribution table; packets keep their order).
  ``--queue-bypass``: if the helper is gone, packets pass undelayed rather than vanish.

Delay is applied on each node's egress only, so between two nodes with ``delay D`` the emulated
round-trip time is 2·D (D on the way out of the sender, D on the way out of the receiver).
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from testbed.errors import TestbedError
from testbed.mesh import netns
from testbed.mesh.build import MeshLayout, NodeSpec
from testbed.mesh.control import specs_for, status_row
from testbed.mesh.local import start_node, wait_ready
from testbed.mesh.state import TestbedState, is_ours, start_ticks, stop_pid, write_state

CHAIN = "am_fault"
QUEUE = 0
HELPER_START_S = 10.0


# --- netem-like specs --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Netem:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    @property
    def active(self) -> bool:
        return self.delay_ms > 0 or self.loss_pct > 0

    def describe(self) -> str:
        parts = []
        if self.delay_ms:
            parts.append(f"delay {self.delay_ms:g}ms" + (f" {self.jitter_ms:g}ms" if self.jitter_ms else ""))
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g}%")
        return " ".join(parts) or "none"

    @property
    def emulated_rtt_ms(self) -> float:
        """Node-to-node RTT: the delay is applied on both nodes' egress, so 2 x delay (jitter has mean 0)."""
        return 2 * self.delay_ms


def parse_time_ms(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)?\s*", text)
    if not m:
        raise TestbedError("bad_netem", f"expected a time like 25ms, 0.5s or 250us, got {text!r}")
    value, unit = float(m.group(1)), m.group(2) or "ms"
    return value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def parse_pct(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%?\s*", text)
    if not m or not 0 <= float(m.group(1)) <= 100:
        raise TestbedError("bad_netem", f"expected a percentage like 1% (0..100), got {text!r}")
    return float(m.group(1))


def parse_netem(text: str) -> Netem:
    """``delay 25ms [5ms] [loss 1%]`` (the tc-netem words this testbed emulates)."""
    words = text.split()
    out = Netem()
    i = 0
    while i < len(words):
        w = words[i]
        if w == "delay" and i + 1 < len(words):
            out = replace(out, delay_ms=parse_time_ms(words[i + 1]))
            i += 2
            if i < len(words) and re.fullmatch(r"[0-9.]+(us|ms|s)?", words[i]):
                out = replace(out, jitter_ms=parse_time_ms(words[i]))
                i += 1
        elif w == "loss" and i + 1 < len(words):
            out = replace(out, loss_pct=parse_pct(words[i + 1]))
            i += 2
        else:
            raise TestbedError("bad_netem", f"cannot parse netem spec {text!r} at {w!r} "
                                            "(supported: delay TIME [JITTER] loss PCT%)")
    if out.jitter_ms > out.delay_ms:
        raise TestbedError("bad_netem", f"jitter {out.jitter_ms:g}ms exceeds delay {out.delay_ms:g}ms")
    return out


# --- iptables chain in a node namespace --------------------------------------------------------------

def _ipt(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return netns.in_ns(ns, "iptables", "-w", "5", *args, check=check)


def _ensure_chain(ns: str) -> None:
    if _ipt(ns, "-S", CHAIN, check=False).returncode != 0:
        _ipt(ns, "-N", CHAIN)
        _ipt(ns, "-A", "OUTPUT", "-j", CHAIN)


def _render_chain(root: Path, net: netns.NetState, index: int) -> None:
    """Rewrite node ``index``'s am_fault chain from the recorded partitions and netem."""
    nn = net.node(index)
    _ensure_chain(nn.ns)
    _ipt(nn.ns, "-F", CHAIN)
    for a, b in net.partitions:
        if index in (a, b):
            other = net.node(b if index == a else a)
            _ipt(nn.ns, "-A", CHAIN, "-d", f"{other.addr}/32", "-j", "DROP")
    f = net.faults.get(str(index))
    if f and Netem(f["delay_ms"], f["jitter_ms"], f["loss_pct"]).active:
        _ipt(nn.ns, "-A", CHAIN, "-o", netns.NODE_IF, "-d", netns.SUBNET.format(k=net.k),
             "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass")


def _start_helper(root: Path, nn: netns.NodeNet, em: Netem) -> tuple[int, int]:
    log = open(Path(root) / f"delayd-n{nn.index}.log", "ab")
    try:
        proc = subprocess.Popen(["ip", "netns", "exec", nn.ns, sys.executable, "-m", "testbed.faults", "delayd",
                                 "--queue", str(QUEUE), "--delay-ms", str(em.delay_ms),
                                 "--jitter-ms", str(em.jitter_ms), "--loss-pct", str(em.loss_pct)],
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONPATH": netns.pythonpath()})
    finally:
        log.close()
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], HELPER_START_S)
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if line != "ready":
        proc.kill()
        proc.wait(5)
        raise TestbedError("fault_failed", f"delay helper in {nn.ns} did not start "
                                           f"(see {Path(root) / f'delayd-n{nn.index}.log'})")
    return proc.pid, start_ticks(proc.pid) or 0


def set_netem(root: Path, net: netns.NetState, index: int, em: Netem) -> None:
    """Give node ``index``'s egress the conditions ``em`` (replacing earlier latency/loss on it)."""
    nn = net.node(index)
    old = net.faults.pop(str(index), None)
    if old:
        netns.stop_helper(old)
    if em.active:
        pid, ticks = _start_helper(root, nn, em)
        net.faults[str(index)] = {"delay_ms": em.delay_ms, "jitter_ms": em.jitter_ms, "loss_pct": em.loss_pct,
                                  "pid": pid, "pid_ticks": ticks}
    netns.write_net(root, net)
    _render_chain(root, net, index)


def partition(root: Path, net: netns.NetState, a: int, b: int) -> None:
    if a == b:
        raise TestbedError("bad_fault", "partition needs two different nodes")
    pair = sorted((a, b))
    if pair not in net.partitions:
        net.partitions.append(pair)
    netns.write_net(root, net)
    for i in pair:
        _render_chain(root, net, i)
    for i, j in ((a, b), (b, a)):
        netns.in_ns(net.node(i).ns, "ss", "-K", "dst", net.node(j).addr, check=False)


def heal(root: Path, net: netns.NetState, index: int | None) -> list[int]:
    """Remove latency/loss and partitions of one node (or all); returns the nodes whose chains changed."""
    touched: set[int] = set()
    for a, b in list(net.partitions):
        if index is None or index in (a, b):
            net.partitions.remove([a, b])
            touched |= {a, b}
    for key in list(net.faults):
        if index is None or int(key) == index:
            netns.stop_helper(net.faults.pop(key))
            touched.add(int(key))
    netns.write_net(root, net)
    for i in sorted(touched):
        _render_chain(root, net, i)
    return sorted(touched)


def describe(net: netns.NetState | None, index: int) -> dict:
    if net is None:
        return {}
    f = net.faults.get(str(index))
    return {"netns": net.node(index).ns, "addr": net.node(index).addr,
            "netem": Netem(f["delay_ms"], f["jitter_ms"], f["loss_pct"]).describe() if f else "none",
            "helper": ("alive" if netns.helper_alive(f) else "DEAD") if f else "-",
            "partitioned_from": sorted(b if a == index else a for a, b in net.partitions if index in (a, b))}


def node_rows(root: Path) -> list[dict]:
    """`testbed status` rows for a namespaced testbed: health asked inside each node's namespace, and the
    faults on each node."""
    state, net, specs = specs_for(root)
    rows = []
    for n, spec in zip(state.nodes, specs, strict=True):
        mcp = f"ip netns exec {spec.netns} ... {n.mcp_endpoint}" if n.mcp_http_port else "-"
        rows.append({**status_row(n, spec, is_ours(n), mcp), **describe(net, n.index)})
    return rows


# --- the CLI's `fault` subcommand --------------------------------------------------------------------

def _need_net(net: netns.NetState | None, what: str, root: Path) -> netns.NetState:
    if net is None:
        raise TestbedError("no_netns", f"`fault {what}` needs a testbed started with `testbed up --netns` "
                                       f"(the one in {root} runs on loopback only: no per-node network faults)")
    return net


@dataclass
class _FaultTarget:
    """The testbed a fault applies to, and the fault's command-line arguments."""

    root: Path
    state: TestbedState
    net: netns.NetState | None
    specs: list[NodeSpec]
    action: str
    args: list[str]
    timeout_s: float

    def need(self, n: int) -> None:
        if len(self.args) < n:
            raise TestbedError("bad_fault", f"`fault {self.action}` needs {n} argument(s)")

    def index(self, name: str) -> int:
        return self.state.node(name).index

    def netns_state(self) -> netns.NetState:
        return _need_net(self.net, self.action, self.root)


def _fault_latency(t: _FaultTarget) -> list[str]:
    t.need(2)
    net = t.netns_state()
    i = t.index(t.args[0])
    old = net.faults.get(str(i), {})
    em = Netem(parse_time_ms(t.args[1]), parse_time_ms(t.args[2]) if len(t.args) > 2 else 0.0,
               old.get("loss_pct", 0.0))
    set_netem(t.root, net, i, em)
    return [f"node-{i}: egress {em.describe()} (RTT to a node without faults +{em.delay_ms:g} ms)"]


def _fault_loss(t: _FaultTarget) -> list[str]:
    t.need(2)
    net = t.netns_state()
    i = t.index(t.args[0])
    old = net.faults.get(str(i), {})
    em = Netem(old.get("delay_ms", 0.0), old.get("jitter_ms", 0.0), parse_pct(t.args[1]))
    set_netem(t.root, net, i, em)
    return [f"node-{i}: egress {em.describe()}"]


def _fault_partition(t: _FaultTarget) -> list[str]:
    t.need(2)
    net = t.netns_state()
    a, b = t.index(t.args[0]), t.index(t.args[1])
    partition(t.root, net, a, b)
    return [f"node-{a} and node-{b} partitioned (traffic between them dropped, connections aborted)"]


def _fault_heal(t: _FaultTarget) -> list[str]:
    net = t.netns_state()
    which = None if not t.args or t.args[0] == "all" else t.index(t.args[0])
    touched = heal(t.root, net, which)
    return [f"healed: {', '.join(f'node-{i}' for i in touched) or 'nothing to heal'}"]


def _fault_kill(t: _FaultTarget) -> list[str]:
    t.need(1)
    node = t.state.node(t.args[0])
    if not is_ours(node):
        return [f"node-{node.index}: not running"]
    os.kill(node.pid, signal.SIGKILL)
    return [f"node-{node.index}: pid {node.pid} SIGKILLed"]


def _fault_restart(t: _FaultTarget) -> list[str]:
    t.need(1)
    node = t.state.node(t.args[0])
    spec = t.specs[node.index - 1]
    lines = []
    if is_ours(node):
        lines.append(f"node-{node.index}: pid {node.pid} {stop_pid(node)}")
    proc = start_node(spec)
    node.pid, node.pid_start_ticks = proc.pid, start_ticks(proc.pid) or 0
    write_state(t.state)
    others_ok = all(is_ours(n) for n in t.state.nodes if n is not node) and not (
        t.net and any(node.index in p for p in t.net.partitions))
    wait_ready(MeshLayout(root=t.root, nodes=t.specs), [spec], {node.index: proc}, timeout_s=t.timeout_s,
               want_links=others_ok)
    lines.append(f"node-{node.index}: restarted as pid {proc.pid}, "
                 + ("every link up" if others_ok else "healthy (some peers down or partitioned)"))
    return lines


_FAULTS: dict[str, Callable[[_FaultTarget], list[str]]] = {
    "latency": _fault_latency, "loss": _fault_loss, "partition": _fault_partition, "heal": _fault_heal,
    "kill": _fault_kill, "restart": _fault_restart,
}


def run_fault(root: Path, action: str, targets: list[str], *, timeout_s: float = 60.0) -> list[str]:
    """Apply one fault to the testbed in ``root``; returns lines to print."""
    state, net, specs = specs_for(root)
    target = _FaultTarget(Path(state.root), state, net, specs, action, targets, timeout_s)
    fault = _FAULTS.get(action)
    if fault is None:
        raise TestbedError("bad_fault", f"unknown fault {action!r}")
    return fault(target)


# --- the user-space netem helper (NFQUEUE) -----------------------------------------------------------

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_DROP, NF_ACCEPT = 0, 1


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _msg(kind: int, flags: int, seq: int, queue: int, attrs: bytes) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _parse(buf: bytes):
    """Yield (type, payload) per netlink message in ``buf``."""
    off = 0
    while off + 16 <= len(buf):
        length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", buf, off)
        if length < 16:
            break
        yield kind, buf[off + 16:off + length]
        off += (length + 3) & ~3


def _packet_id(payload: bytes) -> int | None:
    off = 4  # nfgenmsg
    while off + 4 <= len(payload):
        alen, akind = struct.unpack_from("=HH", payload, off)
        if alen < 4:
            return None
        if akind & 0x3FFF == NFQA_PACKET_HDR:
            return struct.unpack_from("!I", payload, off + 4)[0]
        off += (alen + 3) & ~3
    return None


class _Nfqueue:
    """One NFQUEUE over a netfilter netlink socket: bind and configure it, read packet ids, send verdicts."""

    def __init__(self, queue: int) -> None:
        self.queue = queue
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((0, 0))
        self.seq = 0

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _configure(self, attrs: bytes) -> None:
        self.sock.send(_msg(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, self._next_seq(), self.queue, attrs))
        for kind, payload in _parse(self.sock.recv(65536)):
            if kind == NLMSG_ERROR:
                err = struct.unpack_from("=i", payload)[0]
                if err:
                    raise OSError(-err, f"nfqueue config: {os.strerror(-err)}")

    def bind(self) -> None:
        """Take the queue: packet metadata only, a long queue, fail open when it is full; then non-blocking."""
        self._configure(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
        self._configure(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0xFFFF, NFQNL_COPY_META)))
        self._configure(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536)))
        self._configure(_attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))
                        + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)))
        self.sock.setblocking(False)

    def verdict(self, packet_id: int, v: int) -> None:
        self.sock.send(_msg(NFQNL_MSG_VERDICT, NLM_F_REQUEST, self._next_seq(), self.queue,
                            _attr(NFQA_VERDICT_HDR, struct.pack("!II", v, packet_id))))

    def packet_batches(self) -> Iterator[list[int]]:
        """The queued packets' ids, one list per socket read, until nothing more is waiting."""
        while True:
            try:
                buf = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:  # ENOBUFS: the kernel dropped notifications; those packets are retransmitted
                return
            ids = (_packet_id(payload) for kind, payload in _parse(buf)
                   if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)
            yield [i for i in ids if i is not None]


@dataclass
class _Delayer:
    """Drops a packet with probability loss %, else holds it delay ± jitter (ms), releasing in arrival order."""

    delay_ms: float
    jitter_ms: float
    loss_pct: float
    rng: random.Random
    pending: list[tuple[float, int, int]] = field(default_factory=list)  # (release at, arrival n, packet id)
    last_release: float = 0.0
    arrivals: int = 0

    def admit(self, packet_id: int, now: float) -> bool:
        """Hold the packet for later release (True), or drop it (False)."""
        if self.loss_pct and self.rng.random() * 100 < self.loss_pct:
            return False
        jitter = self.rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
        d = (self.delay_ms + jitter) / 1e3
        self.last_release = max(self.last_release, now + d)  # keep order, as a real link would
        self.arrivals += 1
        heapq.heappush(self.pending, (self.last_release, self.arrivals, packet_id))
        return True

    def due(self, now: float) -> Iterator[int]:
        while self.pending and self.pending[0][0] <= now:
            yield heapq.heappop(self.pending)[2]

    def wait_s(self, now: float) -> float:
        """How long nothing is due (s); 1 s when nothing is held."""
        return max(0.0, self.pending[0][0] - now) if self.pending else 1.0


def delayd(queue: int, delay_ms: float, jitter_ms: float, loss_pct: float) -> int:
    nfq = _Nfqueue(queue)
    nfq.bind()
    print("ready", flush=True)
    os.close(1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    delayer = _Delayer(delay_ms, jitter_ms, loss_pct, random.Random())
    while True:
        now = time.monotonic()
        for packet_id in delayer.due(now):
            nfq.verdict(packet_id, NF_ACCEPT)
        ready, _, _ = select.select([nfq.sock], [], [], delayer.wait_s(now))
        if not ready:
            continue
        for batch in nfq.packet_batches():
            now = time.monotonic()
            for packet_id in batch:
                if not delayer.admit(packet_id, now):
                    nfq.verdict(packet_id, NF_DROP)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.faults")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("delayd", help="user-space netem on NFQUEUE (run inside a node namespace)")
    d.add_argument("--queue", type=int, default=QUEUE)
    d.add_argument("--delay-ms", type=float, default=0.0)
    d.add_argument("--jitter-ms", type=float, default=0.0)
    d.add_argument("--loss-pct", type=float, default=0.0)
    args = p.parse_args(argv)
    return delayd(args.queue, args.delay_ms, args.jitter_ms, args.loss_pct)


if __name__ == "__main__":
    sys.exit(main())
