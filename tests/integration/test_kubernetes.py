"""deploy/kubernetes: the base and the example overlay render with kustomize and pass
``kubernetes-validate --strict``; the pod spec keeps the per-node contract (Guaranteed QoS,
shared memory sized for the arenas, probes on the broker's endpoints, a grace period above the
drain); and a real broker started with the pod's own arguments is driven as the kubelet would
drive it: the startup probe through loading, readiness, the preStop drain with a request in
flight that still completes, SIGTERM, exit 0."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from inferpool.broker.kserve.health import HEALTH_TIMEOUT_S
from inferpool.usage import parse_size
from tests.kube_support import (
    Doc,
    broker_container,
    documents,
    environment,
    expand,
    flag_values,
    kustomize_command,
    one,
    port_number,
    render,
)
from tests.lifecycle.helpers import instance
from tests.node_support import gated_repo, http, not_yet_started, send_held
from tests.support import Server, free_tcp_port, wait_until

pytestmark = pytest.mark.skipif(
    kustomize_command() is None,
    reason="rendering deploy/kubernetes needs kubectl or kustomize on PATH "
    "(pip install -e '.[dev]' installs kubectl beside the interpreter)",
)
LAYERS = ["base", "overlays/example"]
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity(text: str) -> int:
    """Bytes of a Kubernetes binary quantity (``8Gi``)."""
    match = re.fullmatch(r"(\d+)([KMGT]i)?", text)
    assert match is not None, f"not a binary quantity: {text}"
    return int(match[1]) * _UNITS.get(match[2] or "", 1)


def validate_strict(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("layer", LAYERS)
def test_renders_and_passes_strict_validation(layer: str, tmp_path: Path) -> None:
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(render(layer))
    done = validate_strict(rendered)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = {d["kind"] for d in documents(layer)}
    assert {
        "Deployment",
        "ConfigMap",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "PersistentVolumeClaim",
    } <= kinds


def test_strict_validation_rejects_a_misspelt_field(tmp_path: Path) -> None:
    docs = documents("base")
    one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriod"] = 100
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs))
    done = validate_strict(broken)
    assert done.returncode != 0
    assert "terminationGracePeriod" in done.stdout + done.stderr


def _selects(selector: dict[str, str], docs: list[Doc]) -> bool:
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("layer", LAYERS)
def test_the_pod_keeps_the_node_contract(layer: str) -> None:
    docs = documents(layer)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = broker_container(docs)
    flags = flag_values(expand(container["args"], environment(docs, container)))

    # Guaranteed QoS with whole CPUs (the static CPU manager then gives them to the pod alone)
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]
    assert re.fullmatch(r"\d+", str(resources["limits"]["cpu"]))

    # /dev/shm: memory-backed, holding the request arena and an output arena per CPU, inside
    # the memory limit that its pages count against
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    shm = next(v for v in pod["volumes"] if v["name"] == mount["name"])["emptyDir"]
    assert shm["medium"] == "Memory"
    cpus = int(resources["limits"]["cpu"])
    regions = parse_size(flags["--arena-size"][0]) + cpus * parse_size(
        flags["--output-arena-size"][0]
    )
    assert regions <= quantity(shm["sizeLimit"]) < quantity(resources["limits"]["memory"])

    # probes on the health port, each allowed more than the broker's own 5 s to answer
    health_port = int(flags["--health-port"][0])
    for probe, path in (
        ("startupProbe", "/readyz"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ):
        get = container[probe]["httpGet"]
        assert (get["path"], port_number(container, get["port"])) == (path, health_port)
        assert container[probe]["timeoutSeconds"] > HEALTH_TIMEOUT_S
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # minutes to load

    # the drain: preStop over the pod's own ipc socket, a grace period above the drain
    listen = flags["--listen"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "inferpool",
        "drain",
        "--endpoint",
        next(e for e in listen if e.startswith("ipc://")),
    ]
    drain = sum(
        float(flags[f][0]) for f in ("--drain-delay", "--drain-timeout", "--graceful-timeout")
    )
    assert pod["terminationGracePeriodSeconds"] > drain

    # one broker per node; disruptions and the autoscaler act on these pods
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["labelSelector"]["matchLabels"], docs)
    assert _selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], docs)
    target = one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])

    # Services reach the zmq, HTTP and gRPC ports the broker listens on
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named["zmq"] == int(next(e for e in listen if e.startswith("tcp://")).rsplit(":", 1)[1])
    assert (named["http"], named["grpc"]) == (
        int(flags["--http-port"][0]),
        int(flags["--grpc-port"][0]),
    )
    for service in (d for d in docs if d["kind"] == "Service"):
        assert _selects(service["spec"]["selector"], docs)
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(named)


def pod_arguments(tmp: Path, repo: Path) -> tuple[list[str], dict[str, int], Doc]:
    """The base pod's serve arguments, with what must differ on this machine replaced:
    the repository, free ports on 127.0.0.1, small arenas and a 1 s drain delay; the ipc
    endpoint is the test server's own. Returns (arguments, ports by flag, container)."""
    docs = documents("base")
    container = broker_container(docs)
    env = environment(docs, container)
    env.update(
        INFERPOOL_ARENA_SIZE="16M", INFERPOOL_OUTPUT_ARENA_SIZE="8M", INFERPOOL_DRAIN_DELAY="1"
    )
    args = expand(container["args"], env)
    assert args[0] == "serve" and container["command"] == ["inferpool"]
    ports: dict[str, int] = {}
    out = []
    for arg in args[1:]:
        name, _, value = arg.partition("=")
        if name == "--listen":
            continue  # the test server's ipc endpoint; the Services' tcp one is not needed
        if name == "--model-repository":
            value = str(repo)
        elif name.endswith("-port"):
            value = str(ports.setdefault(name, free_tcp_port()))
        elif name.endswith("-address"):
            value = "127.0.0.1"
        out.append(f"{name}={value}")
    return out, ports, container


def test_a_broker_started_as_the_pod_is_driven_as_the_kubelet_would(short_tmp: Path) -> None:
    repo, gate = gated_repo(short_tmp)
    args, ports, container = pod_arguments(short_tmp, repo)
    health = ports["--health-port"]
    probes = {p: container[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")}

    def probe(name: str) -> int:
        return http(port_number(container, health), probes[name]["httpGet"]["path"])[0]

    with not_yet_started(Server(short_tmp, repo, *args)) as server:
        # the startup probe fails while the model loads, then passes
        wait_until(lambda: probe("startupProbe") == 503, what="the broker answers its probes")
        assert probe("livenessProbe") == 200  # not yet run by the kubelet, but true
        (gate / "load").touch()
        wait_until(lambda: probe("startupProbe") == 200, what="started once loaded")
        assert probe("readinessProbe") == 200 and probe("livenessProbe") == 200
        server.wait_started()

        # the autoscaler's metric is one this broker exposes
        hpa = one(documents("base"), "HorizontalPodAutoscaler")["spec"]["metrics"][0]
        status, text = http(ports["--metrics-port"], "/metrics")
        assert status == 200 and f'{hpa["pods"]["metric"]["name"]}{{model="gated"' in text

        with server.client() as c:
            held = send_held(c)
            wait_until(lambda: instance(c, "gated_0")["busy"])
            # pod deletion: the preStop hook runs to its end, then SIGTERM
            command = container["lifecycle"]["preStop"]["exec"]["command"]
            assert command[:3] == ["inferpool", "drain", "--endpoint"]
            done = subprocess.run(
                [sys.executable, "-m", "inferpool", *command[1:3], server.ipc],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout == "draining (asked to drain): 1 request(s) in flight\n"
            assert probe("readinessProbe") == 503  # out of the Services' endpoints
            assert probe("livenessProbe") == 200  # never restarted while it drains
            server.proc.send_signal(signal.SIGTERM)
            (gate / "finish").touch()
            header, frames = c._recv(held, 30)
            assert "error" not in header, header
            assert np.frombuffer(frames[0], np.float32).tolist() == [-1.0]
        grace = one(documents("base"), "Deployment")["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
        assert server.proc.wait(grace) == 0, server.log()
