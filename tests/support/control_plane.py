"""A real Kubernetes control plane on loopback for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake kubelets), optionally mpi-operator and
the Kubeflow training-operator (PyTorchJob only).

The binaries come from ``scripts/build-control-plane.sh`` (``make control-plane``); the pytest
fixture is in ``real_cluster.py``. What it sets up, as a real cluster has it:

- certificates (EC P-256, made here): a CA; the apiserver's serving cert for 127.0.0.1,
  ``localhost`` and the ``kubernetes.default.svc`` names; client certs for the admin
  (O=system:masters), kube-controller-manager and kube-scheduler (their bootstrap RBAC users);
  a separate service-account signing key pair;
- kube-apiserver with ``--authorization-mode=Node,RBAC`` and the default admission plugins plus
  NodeRestriction. ServiceAccount admission stays on: the controller-manager gets
  ``--service-account-private-key-file`` and ``--root-ca-file``, so the ``default``
  ServiceAccount of every namespace and the ``kube-root-ca.crt`` ConfigMap exist and pods are
  admitted. ``start()`` returns once ``default/default`` exists;
- kube-controller-manager with every default controller (garbage collector, disruption, node
  lifecycle, serviceaccount and its token controller, job, namespace, ...), each acting as its
  own ServiceAccount (``--use-service-account-credentials``), no leader election;
- kube-scheduler, no leader election: pods are bound by the real scheduler;
- kwok managing only nodes annotated ``kwok.x-k8s.io/node=fake`` with the stages of
  ``kwok_stages.yaml`` (nodes Ready with their Lease renewed, pods Running with a podIP, deleted
  pods removed; Job-owned pods stay Running until annotated ``spot-autoscaler.test/finish``).
  Nodes get no kwok taint, so ordinary pods schedule on them.

Every process runs in its own process group (and dies with this process on Linux when started
from the main thread: PR_SET_PDEATHSIG). ``stop()`` kills the groups; it also runs on an
exception in ``start()``, at exit, and on SIGINT/SIGTERM (the previous handler is then called).
``leftover_processes()`` lists what is still alive, for tests to assert it is empty.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime
import ipaddress
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "mpi-operator",
    "training-operator",
)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"  # kwok hands out pod IPs from it
# mpi-operator v0.8.2 serves /healthz on :8080 with no flag to change it
# (cmd/mpi-operator/app/server.go, healthCheckPort): one per host at a time.
MPI_OPERATOR_HEALTH_PORT = 8080
LOG_TAIL_LINES = 40
HERE = Path(__file__).resolve().parent
MPIJOB_CRD = HERE / "crds" / "kubeflow.org_mpijobs.yaml"  # equals mpi-operator v0.8.2's
# training-operator v1.9.3's manifests/base/crds/kubeflow.org_pytorchjobs.yaml, alone: its
# kubeflow.org_mpijobs.yaml (v1) would replace mpi-operator's v2beta1 CRD of the same name.
PYTORCHJOB_CRD = HERE / "crds" / "kubeflow.org_pytorchjobs.yaml"
# training-operator's webhook certificates (cmd/training-operator.v1/main.go, pkg/cert/cert.go
# at v1.9.3): the Secret (--webhook-secret-name) in $MY_POD_NAMESPACE, the server name
# <--webhook-service-name>.<namespace>.svc, and the directory cert-controller's rotator waits on,
# a constant with no flag or env (certDir).
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR_SECRET = "training-operator-webhook-cert"
TRAINING_OPERATOR_DNS_NAME = f"training-operator.{TRAINING_OPERATOR_NAMESPACE}.svc"
TRAINING_OPERATOR_CA_NAME = "training-operator-ca"  # pkg/cert/cert.go caName
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
# start_training_operator's readiness probe (group, version, namespace, plural, name)
_PROBE = ("kubeflow.org", "v1", TRAINING_OPERATOR_NAMESPACE, "pytorchjobs", "readiness-probe")
READINESS_PROBE_JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": _PROBE[-1], "namespace": TRAINING_OPERATOR_NAMESPACE},
    "spec": {
        "runPolicy": {"suspend": True},
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": 1,
                "template": {
                    "spec": {"containers": [{"name": "pytorch", "image": "example.invalid/t:1"}]}
                },
            }
        },
    },
}
# The rules of training-operator v1.9.3's manifests/base/rbac/role.yaml (ClusterRole
# `training-operator`), rule for rule: (apiGroups, resources, verbs).
_CRUD = ("create", "delete", "get", "list", "patch", "update", "watch")
TRAINING_OPERATOR_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("",), ("configmaps",), ("create", "list", "update", "watch")),
    (("",), ("events",), _CRUD),
    (("",), ("pods",), _CRUD),
    (("",), ("pods/exec",), ("create",)),
    (("",), ("secrets",), ("get", "list", "update", "watch")),
    (("",), ("serviceaccounts",), ("create", "get", "list", "watch")),
    (("",), ("services",), ("create", "delete", "get", "list", "watch")),
    (
        ("admissionregistration.k8s.io",),
        ("validatingwebhookconfigurations",),
        ("get", "list", "update", "watch"),
    ),
    (("autoscaling",), ("horizontalpodautoscalers",), _CRUD),
    *(
        rule
        for kind in ("jaxjobs", "mpijobs", "paddlejobs", "pytorchjobs", "tfjobs", "xgboostjobs")
        for rule in (
            (("kubeflow.org",), (kind,), _CRUD),
            (("kubeflow.org",), (f"{kind}/finalizers",), ("update",)),
            (("kubeflow.org",), (f"{kind}/status",), ("get", "patch", "update")),
        )
    ),
    (("rbac.authorization.k8s.io",), ("rolebindings",), ("create", "list", "update", "watch")),
    (("rbac.authorization.k8s.io",), ("roles",), ("create", "list", "update", "watch")),
    (("scheduling.volcano.sh",), ("podgroups",), _CRUD),
    (("scheduling.x-k8s.io",), ("podgroups",), _CRUD),
)

T = TypeVar("T")


@dataclass(frozen=True)
class KwokParallelism:
    """How many node Leases kwok renews, node stages and pod stages it plays, at a time (the
    options of a KwokConfiguration; kwok's defaults are small, 4 Leases and 4 pod stages)."""

    node_leases: int
    node_stages: int
    pod_stages: int

    def configuration(self) -> str:
        """A KwokConfiguration naming all three: one that leaves an option out leaves it 0."""
        options = {
            "nodeLeaseParallelism": self.node_leases,
            "nodePlayStageParallelism": self.node_stages,
            "podPlayStageParallelism": self.pod_stages,
        }
        conf = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": options,
        }
        return yaml.safe_dump(conf, sort_keys=False)


class ControlPlaneError(RuntimeError):
    """A component failed to start or become healthy (the message names it, with its log)."""


def wait_until(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll `condition()` until it returns something truthy; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (ip_local_port_range)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def free_port() -> int:
    """A loopback TCP port nobody listens on now, below the kernel's ephemeral range: a port
    from that range (what binding to port 0 gives) can be taken by any outgoing connection
    between this choice and the server's own bind (a kube-scheduler failed so: "bind: address
    already in use")."""
    low = _ephemeral_low()
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneError("no free loopback port below the ephemeral range")


def port_in_use(port: int) -> bool:
    """Something listens on `port` (any address). SO_REUSEADDR as Go's listeners set it, so
    connections lingering in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
        return False


# --- certificates --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pair:
    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.CertificateBuilder:
    """A certificate of `key`'s public half, valid from 5 minutes ago (clock skew) for 2 days."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


class _CertAuthority:
    def __init__(self, directory: Path, stem: str = "ca", common_name: str = "test-ca") -> None:
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self.cert = (
            _builder(self.name, self.name, self.key, ca=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / f"{stem}.crt"
        self.key_path = directory / f"{stem}.key"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.key, self.key_path)

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        server_names: Sequence[str] = (),
        server_ips: Sequence[str] = (),
    ) -> _Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        server = bool(server_names or server_ips)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(x509.Name(attrs), self.name, key, ca=False).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if server:
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pair = _Pair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def webhook_certificates(
    dns_name: str, ca_name: str = TRAINING_OPERATOR_CA_NAME
) -> dict[str, bytes]:
    """A CA and a serving certificate that cert-controller v0.12.0's rotator keeps as they are,
    as the Secret keys it uses (ca.crt, ca.key, tls.crt, tls.key). Read in its
    pkg/rotator/rotator.go: `refreshCertIfNeeded` leaves a Secret alone ("no cert refresh
    needed") when `validCACert` and `validServerCert` pass, which verify the CA against its own
    name and the server certificate against `DNSName` with ExtKeyUsageServerAuth, both at now +
    LookaheadInterval (90 days); and `ReconcileWH.Reconcile` (the step that marks the CA injected,
    without which the rotator never signals ready) parses ca.key with
    x509.ParsePKCS1PrivateKey (`buildArtifactsFromSecret`). So, as its `CreateCACert` and
    `CreateCertPEM` make them: RSA 2048 in PKCS#1 PEM, the names as DNS SANs, valid 10 years
    (CA) and 1 year (server) from an hour ago."""
    now = datetime.datetime.now(datetime.UTC)
    begin = now - datetime.timedelta(hours=1)

    def pem_key(key: rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,  # "RSA PRIVATE KEY": PKCS#1
            serialization.NoEncryption(),
        )

    def usage(*, cert_sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=True,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=cert_sign,
            crl_sign=False,
            encipher_only=False,
            decipher_only=False,
        )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "training-operator"),
            x509.NameAttribute(NameOID.COMMON_NAME, ca_name),
        ]
    )
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "ca.key": pem_key(ca_key),
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": pem_key(key),
    }


def _mark_rotator_cert_dir(cert: bytes) -> None:
    """Give cert-controller's rotator the file it waits for. `ensureCertsMounted`
    (pkg/rotator/rotator.go) only os.Stat()s <CertDir>/tls.crt, 10 tries over ~8-17 min, and
    training-operator fixes CertDir at /tmp/k8s-webhook-server/serving-certs (pkg/cert/cert.go,
    `certDir`: no flag, no env). That path is shared by every session on the host, so the file
    is written only if absent and never removed (another session's operator may be waiting on
    it); its content is never read. The webhook server reads its own copy, from $TMPDIR."""
    try:
        ROTATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError), open(ROTATOR_CERT_DIR / "tls.crt", "xb") as f:
            f.write(cert)
    except OSError as e:
        raise ControlPlaneError(f"training-operator: cannot write {ROTATOR_CERT_DIR}: {e}") from e


# --- processes -----------------------------------------------------------------------------


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command (the state first: proc(5)'s third
    field); None for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # the command may hold spaces and parentheses


def _pgid_of(pid: int) -> int | None:
    """The process group of a live (non-zombie) process, from /proc."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[2])


@dataclass
class _Process:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


_LIVE: weakref.WeakSet[ControlPlane] = weakref.WeakSet()
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_HANDLERS_LOCK = threading.Lock()


def _kill_every_live_plane() -> None:
    for plane in list(_LIVE):
        plane.kill()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _kill_every_live_plane()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or a handler not set from Python): die of the signal as before
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_process_guards() -> None:
    """atexit and SIGINT/SIGTERM hooks, chained to whatever handled the signal before (once)."""
    with _HANDLERS_LOCK:
        if _PREVIOUS_HANDLERS or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            _PREVIOUS_HANDLERS[signum] = signal.getsignal(signum)
            signal.signal(signum, _on_signal)
        atexit.register(_kill_every_live_plane)


# --- the control plane ---------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on loopback.

    ``with ControlPlane(bin_dir) as cp:`` starts everything and waits for health (raising
    ControlPlaneError naming the component, with the last 40 lines of its log); on exit every
    process is killed and the temp dir removed (kept after a failed start, with
    ``keep_dir=True`` or env ``SPOT_AUTOSCALER_KEEP_CONTROL_PLANE=1``; a `workdir` given is
    never removed). ``startup_seconds`` says how long each step took.

    `timeout`: seconds each component may take to become healthy. `node_lease_seconds`: the
    Lease duration kwok gives its nodes (renewed every quarter of it). With
    `service_account_credentials=False` the controller-manager runs as the admin instead of one
    ServiceAccount per controller: ~5 s faster to start, less like a real cluster.
    `kwok_parallelism`: kwok's workers (a second kwok --config), for many nodes and pods; None:
    kwok's defaults. `controller_qps`: the controller-manager's and scheduler's client rate
    (--kube-api-qps, burst twice it); None: theirs, 20 and 50. At 20 the node lifecycle
    controller lifts the not-ready taints of ~5 new nodes a second; kwokctl lifts the limits
    for large fake clusters (kwok pkg/kwokctl/components/kube_controller_manager.go,
    DisableQPSLimits: 5000).
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str],
        *,
        workdir: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
        keep_dir: bool | None = None,
        node_lease_seconds: int = 40,
        service_account_credentials: bool = True,
        kwok_parallelism: KwokParallelism | None = None,
        controller_qps: float | None = None,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self.timeout = timeout
        self._workdir_arg = Path(workdir) if workdir is not None else None
        if keep_dir is None:
            keep_dir = os.environ.get("SPOT_AUTOSCALER_KEEP_CONTROL_PLANE") == "1"
        self.keep_dir = keep_dir
        self.node_lease_seconds = node_lease_seconds
        self.service_account_credentials = service_account_credentials
        self.kwok_parallelism = kwok_parallelism
        self.controller_qps = controller_qps
        self.dir = Path()
        self.processes: dict[str, _Process] = {}
        self._pgids: set[int] = set()
        self._pids: set[int] = set()
        self._lock = threading.RLock()
        self.startup_seconds: dict[str, float] = {}
        self.ports: dict[str, int] = {}
        self._clients: list[ApiClient] = []
        self._made_dir = False
        self._failed = False
        self._users: dict[str, _Pair] = {}
        self._extra_probes: dict[str, Callable[[], bool]] = {}  # start_extra's processes

    # --- paths and clients ---------------------------------------------------------------

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (client cert in group system:masters)."""
        return self.dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    def _configuration(self) -> client.Configuration:
        conf = client.Configuration()
        conf.host = self.server
        conf.ssl_ca_cert = str(self.dir / "pki" / "ca.crt")
        return conf

    def api_client(self) -> ApiClient:
        """An official-client ApiClient authenticated by the admin client certificate."""
        conf = self._configuration()
        conf.cert_file = str(self.dir / "pki" / "admin.crt")
        conf.key_file = str(self.dir / "pki" / "admin.key")
        return self._track(ApiClient(conf))

    def client_for_token(self, token: str) -> ApiClient:
        """An ApiClient that authenticates with a bearer token only (no client cert)."""
        conf = self._configuration()
        # The whole header value under both keys: client 36 reads 'BearerToken' (older ones
        # 'authorization') and looks up a prefix only under 'BearerToken', so
        # api_key_prefix={"authorization": "Bearer"} sends the bare token: anonymous.
        conf.api_key = {"BearerToken": f"Bearer {token}", "authorization": f"Bearer {token}"}
        return self._track(ApiClient(conf))

    def _track(self, api: ApiClient) -> ApiClient:
        self._clients.append(api)
        return api

    @contextlib.contextmanager
    def _admin(self) -> Iterator[ApiClient]:
        api = self.api_client()
        try:
            yield api
        finally:
            api.close()
            self._clients.remove(api)

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        missing = [b for b in BINARIES[:5] if not os.access(self.bin_dir / b, os.X_OK)]
        if missing:
            raise ControlPlaneError(
                f"missing in {self.bin_dir}: {', '.join(missing)} (run `make control-plane`)"
            )
        _install_process_guards()
        _LIVE.add(self)
        t0 = time.monotonic()
        try:
            self._prepare_dir()
            self._step("certificates", self._write_certificates)
            self._step("etcd", self._start_etcd)
            self._step("kube-apiserver", self._start_apiserver)
            self._step("controllers", self._start_controllers)
            self._step("default service account", self._wait_default_service_account)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.startup_seconds["total"] = time.monotonic() - t0
        return self

    def _step(self, name: str, action: Callable[[], None]) -> None:
        t0 = time.monotonic()
        action()
        self.startup_seconds[name] = time.monotonic() - t0

    def _prepare_dir(self) -> None:
        if self._workdir_arg is not None:  # the caller's: never removed
            self.dir = self._workdir_arg
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="spot-control-plane-"))
            self._made_dir = True
        for sub in ("pki", "logs", "etcd", "kcm", "scheduler"):
            (self.dir / sub).mkdir(mode=0o700, exist_ok=True)  # etcd warns about anything wider

    def kill(self) -> None:
        """SIGKILL every process group at once, without waiting (signal/atexit safe). Groups
        whose leader was reaped are left alone: their number may belong to someone else now."""
        for proc in list(self.processes.values()):
            if proc.popen.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)

    def stop(self, *, grace: float = 5.0) -> None:
        """SIGTERM the process groups (the apiserver's clients, then the apiserver, then etcd,
        each wave given `grace` seconds), SIGKILL what is left, reap them all and remove the
        temp dir (kept after a failed start, for its logs). Idempotent."""
        with self._lock:
            for api in list(self._clients):
                with contextlib.suppress(Exception):
                    api.close()
            self._clients.clear()
            procs = list(self.processes.values())
            # Clients of the apiserver first (together), then the apiserver, then etcd: nobody
            # logs connection errors on the way down.
            waves = [
                [p for p in procs if p.name not in ("kube-apiserver", "etcd")],
                [p for p in procs if p.name == "kube-apiserver"],
                [p for p in procs if p.name == "etcd"],
            ]
            for wave in waves:
                for proc in wave:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.popen.pid, signal.SIGTERM)
                deadline = time.monotonic() + grace
                for proc in wave:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            self.kill()  # whatever ignored SIGTERM, and any member left in a group
            for proc in procs:
                proc.popen.wait()
            self.processes.clear()
            _LIVE.discard(self)
            if self._made_dir and not (self.keep_dir or self._failed):
                shutil.rmtree(self.dir, ignore_errors=True)

    def leftover_processes(self) -> list[int]:
        """Pids of our processes (or members of their process groups) still alive."""
        alive = {pid for pid in self._pids if _pgid_of(pid) is not None}
        if self._pgids:
            for entry in os.scandir("/proc"):
                if entry.name.isdigit() and _pgid_of(int(entry.name)) in self._pgids:
                    alive.add(int(entry.name))
        return sorted(alive)

    # --- processes -----------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        log = self.dir / "logs" / f"{name}.log"
        main_thread = threading.current_thread() is threading.main_thread()
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # own session and process group: killpg reaches all
                # Die with this process even on SIGKILL. Not from another thread: the death
                # signal fires when the *thread* that forked exits.
                preexec_fn=_die_with_parent if main_thread else None,
            )
        self._pids.add(popen.pid)
        self._pgids.add(popen.pid)
        self.processes[name] = _Process(name, list(argv), log, popen)

    def _failure(self, name: str, problem: str) -> ControlPlaneError:
        proc = self.processes.get(name)
        tail = proc.tail() if proc else "(not started)"
        log = proc.log if proc else "-"
        return ControlPlaneError(f"{name} {problem}; last {LOG_TAIL_LINES} lines of {log}:\n{tail}")

    def _wait_healthy(self, name: str, probe: Callable[[], bool], timeout: float) -> None:
        proc = self.processes[name]
        deadline = time.monotonic() + timeout
        while True:
            code = proc.popen.poll()
            if code is not None:
                raise self._failure(name, f"exited with code {code} while starting")
            if probe():
                self.startup_seconds[f"{name} healthy"] = time.monotonic() - proc.started
                return
            if time.monotonic() > deadline:
                raise self._failure(name, f"not healthy after {timeout:.0f} s")
            time.sleep(0.05)

    def _binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    # --- health probes -------------------------------------------------------------------

    def _ssl_context(self, *, verify: bool = True) -> ssl.SSLContext:
        pki = self.dir / "pki"
        if verify:
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        else:  # the controller-manager and scheduler serve self-signed certificates
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    @staticmethod
    def _get_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def health(self) -> dict[str, bool]:
        """Each running component's health endpoint answers 200 now."""
        probes: dict[str, Callable[[], bool]] = {
            "etcd": lambda: self._get_ok(f"http://127.0.0.1:{self.ports['etcd']}/health"),
            "kube-apiserver": lambda: self._get_ok(f"{self.server}/readyz", self._ssl_context()),
            "kube-controller-manager": lambda: self._get_ok(
                f"https://127.0.0.1:{self.ports['kube-controller-manager']}/healthz",
                self._ssl_context(verify=False),
            ),
            "kube-scheduler": lambda: self._get_ok(
                f"https://127.0.0.1:{self.ports['kube-scheduler']}/readyz",
                self._ssl_context(verify=False),
            ),
            "kwok": lambda: self._get_ok(f"http://127.0.0.1:{self.ports['kwok']}/healthz"),
            "mpi-operator": lambda: self._get_ok(
                f"http://127.0.0.1:{MPI_OPERATOR_HEALTH_PORT}/healthz"
            ),
            "training-operator": lambda: self._get_ok(
                f"http://127.0.0.1:{self.ports.get('training-operator-probe')}/readyz"
            ),
        }
        probes.update(self._extra_probes)
        return {
            name: proc.popen.poll() is None and probes[name]()
            for name, proc in self.processes.items()
        }

    # --- extra processes (e.g. Karpenter: support/karpenter.py) --------------------------

    def start_extra(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        probe: Callable[[], bool],
        timeout: float | None = None,
    ) -> None:
        """Run one more process beside the plane, in its own process group like the others
        (log in logs/<name>.log, killed with the plane), and wait until `probe()` is true;
        `health()` then reports it. ControlPlaneError (with its log) if it exits or times out."""
        self._extra_probes[name] = probe
        self._spawn(name, argv, env)
        self._wait_healthy(name, probe, self.timeout if timeout is None else timeout)

    def stop_extra(self, name: str, grace: float = 10.0) -> int | None:
        """SIGTERM one process started by `start_extra` (SIGKILL after `grace` seconds) and
        forget it; its exit code (negative: the signal that ended it), None if not running."""
        with self._lock:
            proc = self.processes.pop(name, None)
            self._extra_probes.pop(name, None)
        if proc is None:
            return None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGTERM)
        try:
            return proc.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            return proc.popen.wait()

    # --- components ----------------------------------------------------------------------

    def _write_certificates(self) -> None:
        pki = self.dir / "pki"
        ca = _CertAuthority(pki, "ca", "spot-autoscaler-test-ca")
        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            server_ips=["127.0.0.1", service_ip],
        )
        self._users = {
            "admin": ca.issue("admin", "admin", organizations=["system:masters"]),
            "controller-manager": ca.issue("controller-manager", "system:kube-controller-manager"),
            "scheduler": ca.issue("scheduler", "system:kube-scheduler"),
            # bound to TRAINING_OPERATOR_RULES by start_training_operator
            "training-operator": ca.issue("training-operator", "training-operator"),
        }
        # The front proxy (aggregation layer): its own CA, as a kubeadm cluster has it. Without
        # it the controller-manager and scheduler log "missing content for CA bundle
        # requestheader-client-ca-file" over and over (their delegated authentication).
        front = _CertAuthority(pki, "front-proxy-ca", "spot-autoscaler-test-front-proxy-ca")
        front.issue("front-proxy-client", "front-proxy-client")
        sa_key = ec.generate_private_key(ec.SECP256R1())
        _write_key(sa_key, pki / "sa.key")
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.ports = {
            name: free_port()
            for name in (
                "etcd",
                "etcd-peer",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok",
            )
        }
        for user, pair in self._users.items():
            self._write_kubeconfig(self.dir / f"{user}.kubeconfig", user, pair)

    def _write_kubeconfig(self, path: Path, user: str, pair: _Pair) -> None:
        conf = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.dir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        path.chmod(0o600)

    def _start_etcd(self) -> None:
        client_url = f"http://127.0.0.1:{self.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                self._binary("etcd"),
                "--name=test",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_healthy(
            "etcd", lambda: self._get_ok(f"{client_url}/health"), min(self.timeout, 30)
        )

    def _start_apiserver(self) -> None:
        pki = self.dir / "pki"
        port = self.ports["kube-apiserver"]
        self._spawn(
            "kube-apiserver",
            [
                self._binary("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # The "kubernetes" Service's endpoints would be 127.0.0.1, which Endpoints
                # validation refuses (loopback): no reconciler, no repeated errors.
                "--endpoint-reconciler-type=none",
            ],
        )
        ctx = self._ssl_context()
        self._wait_healthy(
            "kube-apiserver", lambda: self._get_ok(f"{self.server}/readyz", ctx), self.timeout
        )

    def _start_controllers(self) -> None:
        pki = self.dir / "pki"
        # The bootstrap role of system:kube-controller-manager only creates ServiceAccounts and
        # their tokens and lists/watches; each controller's write access is in the role of its
        # own ServiceAccount (bootstrappolicy/controller_policy.go). So with its own identity the
        # controller-manager needs --use-service-account-credentials (as kubeadm runs it);
        # without them (~5 s faster start: no token per controller) it runs as the admin.
        kcm_user = "controller-manager" if self.service_account_credentials else "admin"
        kcm = str(self.dir / f"{kcm_user}.kubeconfig")
        sched = str(self.dir / "scheduler.kubeconfig")
        qps = self.controller_qps
        rate = [] if qps is None else [f"--kube-api-qps={qps:g}", f"--kube-api-burst={2 * qps:g}"]
        self._spawn(
            "kube-controller-manager",
            [
                self._binary("kube-controller-manager"),
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['kube-controller-manager']}",
                f"--cert-dir={self.dir / 'kcm'}",
                "--leader-elect=false",
                "--controllers=*",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--use-service-account-credentials={str(self.service_account_credentials).lower()}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *rate,
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                self._binary("kube-scheduler"),
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['kube-scheduler']}",
                f"--cert-dir={self.dir / 'scheduler'}",
                "--leader-elect=false",
                *rate,
            ],
        )
        kwok = [
            self._binary("kwok"),
            f"--kubeconfig={self.kubeconfig_path}",
            f"--config={HERE / 'kwok_stages.yaml'}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
            f"--cidr={POD_CIDR}",
            f"--node-lease-duration-seconds={self.node_lease_seconds}",
        ]
        if self.kwok_parallelism is not None:
            options = self.dir / "kwok-options.yaml"
            options.write_text(self.kwok_parallelism.configuration())
            kwok.append(f"--config={options}")
        self._spawn("kwok", kwok)
        health = self.health()  # warm: the three start in parallel
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            if not health.get(name):
                self._wait_healthy(name, lambda n=name: self.health()[n], self.timeout)

    def _wait_default_service_account(self) -> None:
        with self._admin() as api:
            core = client.CoreV1Api(api)

            def exists() -> bool:
                try:
                    core.read_namespaced_service_account("default", "default")
                except ApiException as e:
                    if e.status == 404:
                        return False
                    raise
                return True

            try:
                wait_until(exists, self.timeout, "ServiceAccount default/default", 0.1)
            except TimeoutError as e:
                raise self._failure("kube-controller-manager", str(e)) from None

    # --- mpi-operator --------------------------------------------------------------------

    def start_mpi_operator(self, timeout: float | None = None) -> None:
        """Install the MPIJob CRD and the `mpi-operator` namespace (its leader-election lock),
        then start mpi-operator and wait until it serves /healthz and holds its Lease.

        Its health port 8080 is fixed (no flag): ControlPlaneError if something listens there.
        """
        timeout = self.timeout if timeout is None else timeout
        binary = self.bin_dir / "mpi-operator"
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"missing in {self.bin_dir}: mpi-operator")
        if "mpi-operator" in self.processes:
            return
        if port_in_use(MPI_OPERATOR_HEALTH_PORT):
            raise ControlPlaneError(
                f"mpi-operator: port {MPI_OPERATOR_HEALTH_PORT} is in use (its health port is "
                "hard-coded; another mpi-operator or anything else on :8080 blocks it)"
            )
        with self._admin() as api:
            self.apply_crd(api, MPIJOB_CRD, timeout)
            with contextlib.suppress(ApiException):  # exists
                client.CoreV1Api(api).create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name="mpi-operator"))
                )
            env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
            env["KUBECONFIG"] = str(self.kubeconfig_path)  # overrides --kubeConfig anyway
            self._spawn(
                "mpi-operator",
                [
                    str(binary),
                    f"--kubeConfig={self.kubeconfig_path}",
                    "--lock-namespace=mpi-operator",
                    "--monitoring-port=0",
                ],
                env,
            )
            coordination = client.CoordinationV1Api(api)

            def leading() -> bool:
                if not self._get_ok(f"http://127.0.0.1:{MPI_OPERATOR_HEALTH_PORT}/healthz"):
                    return False
                try:
                    lease = coordination.read_namespaced_lease("mpi-operator", "mpi-operator")
                except ApiException:
                    return False
                return bool(lease.spec and lease.spec.holder_identity)

            self._wait_healthy("mpi-operator", leading, timeout)

    # --- training-operator ---------------------------------------------------------------

    @property
    def training_operator_cert_dir(self) -> Path:
        """Where training-operator's webhook server reads tls.crt/tls.key: controller-runtime
        v0.19's default, os.TempDir()/k8s-webhook-server/serving-certs (pkg/webhook/server.go,
        `setDefaults`), with TMPDIR set to this run's directory."""
        return self.dir / "training-operator" / "k8s-webhook-server" / "serving-certs"

    def start_training_operator(self, timeout: float | None = None) -> None:
        """Install the PyTorchJob CRD, then start the Kubeflow training-operator v1.9.3 for
        PyTorchJobs only and wait until its PyTorchJob controller runs.

        Its webhooks cannot be turned off: it starts its controllers only once cert-controller's
        rotator says the certificates are ready (cmd/training-operator.v1/main.go,
        `setupControllers` waits on `certsReady`). The rotator needs the Secret
        `training-operator-webhook-cert` to exist in namespace `kubeflow` and a tls.crt in a
        fixed directory. Here the namespace and the Secret are created with certificates the
        rotator accepts as they are (`webhook_certificates`), its directory gets a tls.crt
        (`_mark_rotator_cert_dir`) and the webhook server its pair in this run's temp dir (env
        TMPDIR). No ValidatingWebhookConfiguration is made: the rotator only logs that it is
        missing (`ReconcileWH.ensureCerts`), and the API server never calls the webhook.

        It runs as user `training-operator` (a client certificate) bound to the rules of its
        manifests/base/rbac/role.yaml; no leader election; metrics, health and webhook on free
        ports (its defaults :8080 and :8081 would clash with mpi-operator's health port).
        Ready: /readyz answers (certificates ready, webhook server listening) and a suspended
        PyTorchJob in `kubeflow` got its Suspended condition (so the PyTorchJob controller runs
        with its pod and Service caches synced); the probe job is deleted then. Its "Starting
        workers" log line is no such sign: it comes before the Pod and Service watches start.
        """
        timeout = self.timeout if timeout is None else timeout
        name = "training-operator"
        binary = self.bin_dir / name
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"missing in {self.bin_dir}: {name} (run `make control-plane`)")
        if name in self.processes:
            return
        certs = webhook_certificates(TRAINING_OPERATOR_DNS_NAME)
        serving = self.training_operator_cert_dir
        serving.mkdir(mode=0o700, parents=True, exist_ok=True)
        (serving / "tls.crt").write_bytes(certs["tls.crt"])
        (serving / "tls.key").write_bytes(certs["tls.key"])
        (serving / "tls.key").chmod(0o600)
        _mark_rotator_cert_dir(certs["tls.crt"])
        ports = {port: free_port() for port in ("metrics", "probe", "webhook")}
        self.ports.update({f"{name}-{port}": number for port, number in ports.items()})
        # no KUBEFLOW_NAMESPACE: --namespace defaults to it, and "" watches every namespace
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("KUBECONFIG", "KUBEFLOW_NAMESPACE", "MY_POD_NAMESPACE", "TMPDIR")
        }
        kubeconfig = self.dir / f"{name}.kubeconfig"
        env["KUBECONFIG"] = str(kubeconfig)
        env["MY_POD_NAMESPACE"] = TRAINING_OPERATOR_NAMESPACE  # pkg/cert getOperatorNamespace
        env["TMPDIR"] = str(self.dir / name)  # the webhook server's cert dir (Go's os.TempDir)
        with self._admin() as api:
            t0 = time.monotonic()
            self.apply_crd(api, PYTORCHJOB_CRD, timeout)
            self.startup_seconds["PyTorchJob CRD"] = time.monotonic() - t0
            self._install_training_operator_objects(api, certs)
            self._spawn(
                name,
                [
                    str(binary),
                    f"--kubeconfig={kubeconfig}",
                    "--enable-scheme=pytorchjob",
                    "--leader-elect=false",
                    f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
                    f"--health-probe-bind-address=127.0.0.1:{ports['probe']}",
                    f"--webhook-server-port={ports['webhook']}",
                    "--zap-log-level=info",
                ],
                env,
            )
            custom = client.CustomObjectsApi(api)
            readyz = f"http://127.0.0.1:{ports['probe']}/readyz"

            def reconciled() -> bool:
                if not self._get_ok(readyz):
                    return False
                job = custom.get_namespaced_custom_object(*_PROBE)
                conditions = (job.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions)

            try:
                self._wait_healthy(name, reconciled, timeout)
            finally:
                with contextlib.suppress(ApiException):
                    custom.delete_namespaced_custom_object(*_PROBE)

    def _install_training_operator_objects(
        self, api: ApiClient, certs: Mapping[str, bytes]
    ) -> None:
        """The namespace `kubeflow` with the webhook Secret holding `certs`, the ClusterRole of
        its role.yaml bound to user `training-operator`, and the readiness probe: a suspended
        PyTorchJob. For that one ReconcileJobs (pkg/controller.v1/common/job.go) lists the
        job's pods and Services from the operator's caches (blocking until they synced) before
        it writes the Suspended condition, and makes no pod."""
        core = client.CoreV1Api(api)
        with contextlib.suppress(ApiException):  # exists
            core.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=TRAINING_OPERATOR_NAMESPACE))
            )
        secret = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=TRAINING_OPERATOR_SECRET, namespace=TRAINING_OPERATOR_NAMESPACE
            ),
            data={k: base64.b64encode(v).decode() for k, v in certs.items()},
        )
        try:
            core.create_namespaced_secret(TRAINING_OPERATOR_NAMESPACE, secret)
        except ApiException as e:
            if e.status != 409:
                raise
            core.replace_namespaced_secret(
                TRAINING_OPERATOR_SECRET, TRAINING_OPERATOR_NAMESPACE, secret
            )
        self._grant_training_operator_rbac(api)
        custom = client.CustomObjectsApi(api)
        with contextlib.suppress(ApiException):  # left by an earlier start: made again
            custom.delete_namespaced_custom_object(*_PROBE)
        custom.create_namespaced_custom_object(*_PROBE[:-1], READINESS_PROBE_JOB)

    def _grant_training_operator_rbac(self, api: ApiClient) -> None:
        rbac = client.RbacAuthorizationV1Api(api)
        rules = [
            {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}
            for groups, resources, verbs in TRAINING_OPERATOR_RULES
        ]
        role_ref = {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "training-operator",
        }
        subject = {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "User",
            "name": "training-operator",
        }
        for create in (
            lambda: rbac.create_cluster_role(
                {"metadata": {"name": "training-operator"}, "rules": rules}
            ),
            lambda: rbac.create_cluster_role_binding(
                {
                    "metadata": {"name": "training-operator"},
                    "roleRef": role_ref,
                    "subjects": [subject],
                }
            ),
        ):
            try:
                create()
            except ApiException as e:
                if e.status != 409:
                    raise

    @staticmethod
    def apply_crd(api: ApiClient, path: Path, timeout: float = 30) -> None:
        """Create a CRD from a YAML file (if absent) and wait until it is Established."""
        body = yaml.safe_load(path.read_text())
        ext = client.ApiextensionsV1Api(api)
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as e:
            if e.status != 409:
                raise
        name = body["metadata"]["name"]

        def established() -> bool:
            crd = ext.read_custom_resource_definition(name)
            conditions = (crd.status and crd.status.conditions) or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_until(established, timeout, f"CRD {name} Established")

    # --- cluster content -----------------------------------------------------------------

    def add_gpu_nodes(
        self,
        names: Iterable[str],
        gpus: int = 8,
        labels: Mapping[str, str] | None = None,
        capacity_type: str = "spot",
        *,
        instance_type: str = "p4d.24xlarge",
        cpu: str = "96",
        memory: str = "1152Gi",
        pods: str = "110",
        wait_ready: bool = True,
        timeout: float = 30,
        pod_cidrs: Sequence[str] = (),
    ) -> list[str]:
        """Create kwok-managed Nodes with `gpus` nvidia.com/gpu in capacity and allocatable.

        `pod_cidrs`, one per node: its `spec.podCIDR`, from which kwok gives its pods their IPs
        (pod_controller.go: a node's podCIDRs before its --cidr); e.g. a loopback range, for a
        test that must reach a pod's IP on this machine.

        The status is set on creation (the API server keeps a Node's status on create) and
        kwok's node-initialize stage keeps it. No kwok taint: ordinary pods schedule here. With
        `wait_ready`, returns once each node is Ready and without the not-ready taint that
        TaintNodesByCondition puts on new nodes (removed by the node lifecycle controller).
        """
        names = list(names)
        resources = {"cpu": cpu, "memory": memory, "pods": pods, "nvidia.com/gpu": str(gpus)}
        cidrs = {n: {"podCIDR": c, "podCIDRs": [c]} for n, c in zip(names, pod_cidrs, strict=False)}
        with self._admin() as api:
            core = client.CoreV1Api(api)
            for name in names:
                node_labels = {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": instance_type,
                    "karpenter.sh/capacity-type": capacity_type,
                    "type": "kwok",
                    **(labels or {}),
                }
                core.create_node(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": name,
                            "labels": node_labels,
                            "annotations": {KWOK_ANNOTATION: "fake"},
                        },
                        "spec": {"providerID": f"kwok://{name}", **cidrs.get(name, {})},
                        "status": {"capacity": resources, "allocatable": resources},
                    }
                )
            if wait_ready:

                def ready(name: str) -> bool:
                    node = core.read_node(name)
                    conds = node.status.conditions or []
                    taints = node.spec.taints or []
                    return any(c.type == "Ready" and c.status == "True" for c in conds) and not any(
                        t.key.startswith("node.kubernetes.io/") for t in taints
                    )

                for name in names:
                    wait_until(lambda n=name: ready(n), timeout, f"node {name} Ready")
        return names

    def token_for(
        self,
        service_account: str,
        namespace: str = "default",
        expiration_seconds: int = 3600,
        pod: str | None = None,
    ) -> str:
        """A bound token for the ServiceAccount (created if absent) from the TokenRequest API;
        with `pod`, bound to a Pod of that name running as the account (made if absent; never
        scheduled), as the kubelet's projected token is: the server then knows which pod sends
        (`authentication.kubernetes.io/pod-name`, what deploy/leader-fence.yaml checks)."""
        with self._admin() as api:
            core = client.CoreV1Api(api)
            try:
                core.create_namespaced_service_account(
                    namespace,
                    client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=service_account)),
                )
            except ApiException as e:
                if e.status != 409:
                    raise
            bound = None
            if pod is not None:
                uid = _daemon_pod(core, namespace, pod, service_account)
                bound = client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod, uid=uid
                )
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=[], expiration_seconds=expiration_seconds, bound_object_ref=bound
                )
            )
            answer = core.create_namespaced_service_account_token(
                service_account, namespace, request
            )
            return str(answer.status.token)


def _daemon_pod(core: client.CoreV1Api, namespace: str, name: str, account: str) -> str:
    """The uid of Pod `name` (made if absent): the account's, selecting no node, so no scheduler
    binds it and no controller removes it while the test runs."""
    body = {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "spot-autoscaler-test"}},
        "spec": {
            "serviceAccountName": account,
            "nodeSelector": {"spot-autoscaler.io/test-daemon-pod": "nowhere"},
            # the Deployment's (deploy/deployment.yaml): Pod Security's `restricted` admits it
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "daemon",
                    "image": "spot-autoscaler",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    try:
        return str(core.create_namespaced_pod(namespace, body).metadata.uid)
    except ApiException as e:
        if e.status != 409:
            raise
    return str(core.read_namespaced_pod(name, namespace).metadata.uid)
