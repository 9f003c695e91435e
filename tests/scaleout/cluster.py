"""A Ray cluster of two nodes on this machine: each node a network namespace with its own
address (10.231.0.N on a bridge whose end in the root namespace is 10.231.0.254), its own
broker (its own service, started here, never by Ray) and its own Ray node.

Needs root (``ip netns``, veth pairs, a bridge) and Ray Serve (``pip install
'inferpool[ray]'``).  Namespaces share the file system, so each node's broker listens on its own
ipc path and the node's Ray processes are told it ($INFERPOOL_ENDPOINT, $INFERPOOL_HEALTH_URL):
the replica Ray starts there inherits them.  Every process started here is in its own session,
ended by its process group; the bridge and namespaces are deleted on the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.node_support import http
from tests.support import kill_tree, run_id_of, wait_until

SUBNET = "10.231.0"
HEALTH_PORT = 8003
SERVE_PORT = 8000
RAY_PORT = 6379


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def ended(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> int:
    """Signal ``proc``'s process group (SIGKILL: every process under it too) and wait for
    ``proc``."""
    if sig == signal.SIGKILL:
        kill_tree(proc.pid)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    return proc.wait(60)


class Node:
    def __init__(self, index: int, netns: str, tmp: Path, repo: Path) -> None:
        self.name = f"n{index}"
        self.netns = netns
        self.ip = f"{SUBNET}.{index}"
        self.endpoint = f"ipc://{tmp}/{self.name}.sock"
        self.tmp = tmp
        self.repo = repo
        self.broker: subprocess.Popen[bytes] | None = None
        self.ray: subprocess.Popen[bytes] | None = None
        self.runs: list[str] = []  # every broker run of this node

    @property
    def serve_url(self) -> str:
        return f"http://{self.ip}:{SERVE_PORT}/inferpool"

    def health(self, path: str, method: str = "GET") -> tuple[int, str]:
        return http(HEALTH_PORT, path, method, self.ip)

    def run(
        self, *cmd: str, env: dict[str, str] | None = None, log: str
    ) -> subprocess.Popen[bytes]:
        """``cmd`` inside this node's namespace, in a session of its own."""
        with open(self.tmp / f"{self.name}-{log}.log", "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NODE": self.name, "RAY_AUTH_MODE": "disabled", **(env or {})},
                start_new_session=True,
                cwd=self.tmp,
            )

    def start_broker(self, drain_delay: float) -> None:
        self.broker = self.run(
            sys.executable,
            "-m",
            "inferpool",
            "serve",
            f"--model-repository={self.repo}",
            f"--listen={self.endpoint}",
            f"--health-address={self.ip}",
            f"--health-port={HEALTH_PORT}",
            "--http-port=0",
            "--grpc-port=0",
            f"--drain-delay={drain_delay}",
            "--drain-timeout=30",
            "--arena-size=32M",
            "--output-arena-size=16M",
            "--no-prefault",
            log="broker",
        )
        wait_until(lambda: self.health("/readyz")[0] == 200, f"{self.name}'s broker ready", 120)
        self.runs.append(run_id_of(self.broker.pid))

    def log(self, what: str) -> str:
        return (self.tmp / f"{self.name}-{what}.log").read_text(errors="replace")

    def start_ray(self, head: Node | None) -> None:
        where = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        if head is not None:
            where = [f"--address={head.ip}:{RAY_PORT}"]
        self.ray = self.run(
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            *where,
            f"--node-ip-address={self.ip}",
            "--num-cpus=1",
            f"--resources={json.dumps({'inferpool': 1})}",
            f"--temp-dir={self.tmp / 'ray'}",
            "--disable-usage-stats",
            env={
                "INFERPOOL_ENDPOINT": self.endpoint,
                "INFERPOOL_HEALTH_URL": f"http://{self.ip}:{HEALTH_PORT}/readyz",
            },
            log="ray",
        )


@contextlib.contextmanager
def network(count: int) -> Iterator[list[str]]:
    """``count`` namespaces on a bridge; their names."""
    tag = f"{os.getpid() % 100000}"
    bridge = f"iptb{tag}"
    names = [f"ipt{tag}n{i}" for i in range(1, count + 1)]
    made: list[str] = []
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        made.append(bridge)
        sh("ip", "addr", "add", f"{SUBNET}.254/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for i, ns in enumerate(names, 1):
            host, inner = f"ipt{tag}h{i}", f"ipt{tag}c{i}"
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", host, "master", bridge)
            sh("ip", "link", "set", host, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{SUBNET}.{i}/24", "dev", inner)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        yield names
    finally:
        for name in reversed(made):  # a namespace's veth goes with it, then the bridge
            cmd = ["ip", "link", "del", name] if name == bridge else ["ip", "netns", "del", name]
            subprocess.run(cmd, capture_output=True, timeout=30)


def can_build() -> str:
    """Empty when this machine can build the cluster; otherwise why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        return "Ray Serve is not installed (pip install 'inferpool[ray]')"
    for tool in (["ip", "netns", "list"], ["ip", "link", "show"]):
        if subprocess.run(tool, capture_output=True).returncode != 0:
            return f"`{' '.join(tool)}` fails here"
    return ""
