"""The embedded Apache Kafka broker: KRaft nodes from the official Apache Kafka jars.

``chandy kafka up | down | status`` and the test fixtures use :class:`EmbeddedKafkaBroker`, one
node by default or a cluster of ``nodes`` nodes (``chandy kafka up --nodes 3``), optionally with
SASL/SCRAM authentication and ``StandardAuthorizer`` ACLs (``--security sasl-scram``). The jars
of a pinned Apache Kafka release are resolved from Maven Central with Maven (the ``pom.xml``
beside this module) and cached under the user's cache directory; Java 17 or newer is the only
system requirement besides Maven. Every node binds to 127.0.0.1 only and keeps its data and its
log in one directory; internal topics get as many replicas as the cluster can give (one, or
three with ``min.insync.replicas`` 2 on three nodes or more).

State kept in the data directory (a cluster keeps each node's files in ``node-<id>/``):

- ``server.properties``: the node's configuration, written at each start;
- ``broker.json``: pids, ports, version and security of the running nodes (see :class:`BrokerInfo`);
- ``credentials.json``: SCRAM users and passwords, with security on (mode 0600);
- ``broker.log``: the node's log4j2 log; ``broker.out``: its stdout/stderr;
- ``kraft/``: the KRaft metadata and the topic logs.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path

import platformdirs
from confluent_kafka import KafkaException

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config

#: The pinned Apache Kafka release (Maven Central ``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.1.0"
#: Oldest Java feature release the broker runs on.
MIN_JAVA_VERSION = 17
#: Environment variable naming a directory of Kafka jars to use instead of resolving them.
KAFKA_LIBS_ENV = "CHANDY_KAFKA_LIBS"

_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"


class KafkaLauncherError(ChandyError):
    """The embedded broker could not be prepared, started or stopped."""


class JavaNotFoundError(KafkaLauncherError):
    """No Java 17+ runtime was found (``JAVA_HOME`` or ``java`` on the PATH)."""


class KafkaJarsError(KafkaLauncherError):
    """The Apache Kafka jars could not be resolved from Maven Central."""


class BrokerStartError(KafkaLauncherError):
    """The broker process exited or did not answer in time; the message holds its log's tail."""


#: ``--security`` values: no authentication, or SASL/SCRAM over plaintext with ACLs.
SECURITY_MODES = ("none", "sasl-scram")
#: The SCRAM mechanism the embedded broker enables (librdkafka's ``sasl.mechanism`` value).
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The super user (``super.users``) the embedded broker creates for itself and its administrators.
ADMIN_USER = "admin"
#: The key in ``credentials.json`` of the TLS key and trust stores' password (not a user).
_TLS_PASSWORD = "$tls-store"


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """One KRaft node of the embedded cluster (broker and controller in one process).

    ``port`` is its client listener and ``controller_port`` its KRaft controller listener, both
    on 127.0.0.1; ``pid`` is its last known process (it may have died or been killed).
    """

    node_id: int
    pid: int
    port: int
    controller_port: int
    data_dir: str
    log_file: str


@dataclasses.dataclass(frozen=True)
class BrokerInfo:
    """What ``broker.json`` records about a running embedded broker or cluster.

    ``port`` is the client listener and ``controller_port`` the KRaft controller listener of the
    first node, both on 127.0.0.1; ``started_at`` is a Unix time in seconds. ``nodes`` lists
    every node (one for a single broker); ``security`` is one of :data:`SECURITY_MODES` and
    ``client_settings`` the librdkafka settings (``security.protocol``, ``sasl.mechanism``,
    ``sasl.username``, ``sasl.password``, ``ssl.ca.location``) of the super user, empty without
    security; ``tls`` whether the client listener speaks TLS.
    """

    pid: int
    port: int
    controller_port: int
    kafka_version: str
    data_dir: str
    log_file: str
    started_at: float
    nodes: tuple[NodeInfo, ...] = ()
    security: str = "none"
    client_settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tls: bool = False

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>[,...]`` (every node), the value for ``bootstrap.servers``."""
        ports = [node.port for node in self.nodes] or [self.port]
        return ",".join(f"127.0.0.1:{port}" for port in ports)

    def node(self, node_id: int) -> NodeInfo:
        """The node with KRaft ``node.id`` ``node_id``.

        Raises:
            KafkaLauncherError: no such node.
        """
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KafkaLauncherError(f"the embedded cluster in {self.data_dir} has no node {node_id}")

    def to_json(self) -> dict:
        """The ``broker.json`` form: nodes as a list of objects."""
        out = dataclasses.asdict(self)
        out["nodes"] = [dataclasses.asdict(node) for node in self.nodes]
        out["client_settings"] = dict(self.client_settings)
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> BrokerInfo:
        """Read :meth:`to_json`'s form (and the older form without nodes, a single broker)."""
        fields = dict(data)
        nodes = tuple(NodeInfo(**node) for node in fields.pop("nodes", ()))
        if not nodes:
            nodes = (NodeInfo(1, fields["pid"], fields["port"], fields["controller_port"], fields["data_dir"],
                              fields["log_file"]),)
        return cls(**fields, nodes=nodes)


def default_data_dir() -> Path:
    """``<user state dir>/chandy/kafka``: where ``chandy kafka up`` keeps the broker by default."""
    return Path(platformdirs.user_state_dir("chandy")) / "kafka"


def default_cache_dir() -> Path:
    """``<user cache dir>/chandy``: where resolved Kafka jars are cached, one folder per version."""
    return Path(platformdirs.user_cache_dir("chandy"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def find_java() -> str:
    """Path of a ``java`` executable of version 17 or newer.

    Looks in ``$JAVA_HOME/bin`` first, then on the PATH.

    Raises:
        JavaNotFoundError: no java, or one older than 17.
    """
    java_home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(java_home) / "bin" / "java")] if java_home else []
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
        match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
        if match:
            feature = int(match.group(1))
            if feature == 1 and match.group(2):  # "1.8" style
                feature = int(match.group(2))
            if feature >= MIN_JAVA_VERSION:
                return java
            raise JavaNotFoundError(
                f"Java {MIN_JAVA_VERSION}+ is required for the embedded Kafka broker; {java} is Java {feature}"
            )
    raise JavaNotFoundError(
        f"Java {MIN_JAVA_VERSION}+ is required for the embedded Kafka broker: set JAVA_HOME or put java on the PATH"
    )


def resolve_kafka_jars(kafka_version: str = KAFKA_VERSION, cache_dir: Path | None = None) -> Path:
    """Directory holding the jars of Apache Kafka ``kafka_version``, resolving them if needed.

    Uses ``$CHANDY_KAFKA_LIBS`` when set (for example the ``libs/`` of a Kafka distribution);
    otherwise ``<cache_dir>/kafka-<version>/libs``, filled once by Maven from Maven Central and
    marked complete only after every jar arrived, so an interrupted download is redone.

    Raises:
        KafkaJarsError: Maven is missing or the resolution failed (the message has Maven's output).
    """
    env_libs = os.environ.get(KAFKA_LIBS_ENV)
    if env_libs:
        libs = Path(env_libs)
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise KafkaJarsError(f"{KAFKA_LIBS_ENV}={env_libs} holds no kafka_2.13-*.jar")
        return libs
    root = (cache_dir or default_cache_dir()) / f"kafka-{kafka_version}"
    libs = root / "libs"
    marker = root / ".complete"
    if marker.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaJarsError(
            "Maven (mvn) is needed once to fetch the Apache Kafka jars from Maven Central; "
            f"install it, or set {KAFKA_LIBS_ENV} to a directory of Kafka {kafka_version} jars"
        )
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=root))
    pom = resources.files("chandy") / "pom.xml"
    with resources.as_file(pom) as pom_path:
        proc = subprocess.run(
            [
                mvn, "-q", "-B", "-f", str(pom_path),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
                f"-Dkafka.version={kafka_version}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0 or not any(staging.glob(f"kafka_2.13-{kafka_version}.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise KafkaJarsError(
            f"could not resolve Apache Kafka {kafka_version} from Maven Central (mvn exit {proc.returncode}):\n"
            + "\n".join(tail)
        )
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    marker.write_text(kafka_version)
    return libs


def _pid_is_broker(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid
    return _MAIN_CLASS.encode() in cmdline


class EmbeddedKafkaBroker:
    """Apache Kafka in KRaft mode on 127.0.0.1: one node, or a cluster of ``nodes`` nodes.

    Every node runs broker and controller in one JVM (KRaft's combined mode) from the same jars,
    with a static quorum (``controller.quorum.voters``) of all nodes. A cluster of three or more
    creates its internal topics (consumer offsets, transaction state) with three replicas and
    ``min.insync.replicas`` 2, so it survives the loss of one node.

    Args:
        data_dir: where configuration, KRaft metadata, topic logs and logs live
            (default :func:`default_data_dir`); a cluster keeps node ``i`` in ``node-<i>/``.
        port: client port of the first node; default: the port of the last start if still
            free, else a free one.
        nodes: number of KRaft nodes (default: what ``data_dir`` was made with, else 1).
        security: ``none`` (PLAINTEXT) or ``sasl-scram`` (default: what ``data_dir`` was made
            with, kept in ``layout.json``, else ``none``): clients authenticate with
            SASL/SCRAM-SHA-512 over plaintext, ``StandardAuthorizer`` enforces ACLs and
            :data:`ADMIN_USER` (password generated at first start, kept in
            ``credentials.json``, mode 0600) is the only super user. The controller listener
            authenticates with SASL/PLAIN as the admin (SCRAM credentials live in the metadata
            log, which controllers need before they can read it).
        scram_users: user name -> password of SCRAM users, created when the storage is
            formatted (``kafka-storage format --add-scram``); users added on a later start are
            created through the AdminClient (``AlterUserScramCredentials``).
        tls: the client (and inter-broker) listener speaks TLS (``SSL``, or ``SASL_SSL`` with
            SCRAM) with a self-signed certificate for 127.0.0.1 and localhost, generated with
            the JDK's ``keytool`` at first start into ``tls/`` (``ca.pem`` is what clients
            trust: ``ssl.ca.location``). The controller listener stays as without TLS. Default:
            what ``data_dir`` was made with, else off.
        kafka_version: the Apache Kafka release to run (default :data:`KAFKA_VERSION`).
        cache_dir: jar cache root (default :func:`default_cache_dir`).
        heap: JVM heap size for ``-Xmx`` per node (default ``512m``).
        broker_overrides: broker properties under their standard names, written into each
            node's ``server.properties`` over Chandy's defaults.

    ``up()`` is idempotent and guarded by a file lock, so two concurrent callers share one
    cluster; on a cluster whose nodes partly died it restarts the dead ones.

    ``up()`` refuses to start ``data_dir`` with other ``nodes``, ``security`` or ``tls`` than
    it was made with (:class:`BrokerStartError`).

    Raises:
        KafkaLauncherError: ``nodes`` below 1, an unknown ``security``, or a SCRAM user name or
            password with characters ``kafka-storage`` cannot take (``,``, ``]``, ``=``, ``"``).
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        nodes: int | None = None,
        security: str | None = None,
        scram_users: Mapping[str, str] | None = None,
        tls: bool | None = None,
        kafka_version: str = KAFKA_VERSION,
        cache_dir: Path | None = None,
        heap: str = "512m",
        broker_overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        # what the data directory was made with (nodes, security, tls) is kept: a restart without
        # arguments brings back the same cluster, never one without the authentication it had
        self.saved_layout = self._read_layout()
        nodes = nodes if nodes is not None else self.saved_layout.get("nodes", 1)
        security = security if security is not None else self.saved_layout.get("security", "none")
        tls = tls if tls is not None else self.saved_layout.get("tls", False)
        if nodes < 1:
            raise KafkaLauncherError(f"a Kafka cluster needs at least one node, got nodes={nodes}")
        if security not in SECURITY_MODES:
            raise KafkaLauncherError(f"unknown security {security!r}; expected one of {', '.join(SECURITY_MODES)}")
        self.scram_users = dict(scram_users or {})
        for name, password in self.scram_users.items():
            for what, value in (("user name", name), ("password", password)):
                if not value or re.search(r'[,\]="\s]', value):
                    raise KafkaLauncherError(f"SCRAM {what} {value!r} of user {name!r} is empty or holds one of , ] = \" "
                                             "or a space, which kafka-storage --add-scram cannot take")
        if self.scram_users and security != "sasl-scram":
            raise KafkaLauncherError("SCRAM users need --security sasl-scram")
        self.port = port
        self.nodes = nodes
        self.security = security
        self.tls = tls
        self.kafka_version = kafka_version
        self.cache_dir = cache_dir
        self.heap = heap
        self.broker_overrides = dict(broker_overrides or {})

    # -- files -------------------------------------------------------------------------------
    @property
    def info_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def layout_file(self) -> Path:
        return self.data_dir / "layout.json"

    def _read_layout(self) -> dict:
        try:
            return dict(json.loads(self.layout_file.read_text()))
        except (OSError, ValueError, TypeError):
            return {}

    def _layout(self) -> dict:
        return {"nodes": self.nodes, "security": self.security, "tls": self.tls}

    @property
    def credentials_file(self) -> Path:
        return self.data_dir / "credentials.json"

    @property
    def log_file(self) -> Path:
        return self.node_dir(1) / "broker.log"

    @property
    def out_file(self) -> Path:
        return self.node_dir(1) / "broker.out"

    def node_dir(self, node_id: int) -> Path:
        """Node ``node_id``'s directory: ``data_dir`` itself for a single node, else ``data_dir/node-<id>``."""
        return self.data_dir if self.nodes == 1 else self.data_dir / f"node-{node_id}"

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read_info(self) -> BrokerInfo | None:
        try:
            return BrokerInfo.from_json(json.loads(self.info_file.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _write_info(self, info: BrokerInfo) -> None:
        self.info_file.write_text(json.dumps(info.to_json(), indent=2))
        self.info_file.chmod(0o600)  # it holds the admin's password when security is on

    # -- public API --------------------------------------------------------------------------
    def status(self) -> BrokerInfo | None:
        """The running broker's :class:`BrokerInfo`, or None when no node runs from ``data_dir``."""
        info = self._read_info()
        if info is None or not any(_pid_is_broker(node.pid) for node in info.nodes):
            return None
        return info

    def alive_nodes(self) -> list[int]:
        """The ``node.id`` of every node whose process runs now (empty when none does)."""
        info = self._read_info()
        return [] if info is None else [node.node_id for node in info.nodes if _pid_is_broker(node.pid)]

    def up(self, timeout_s: float = 120.0) -> BrokerInfo:
        """Start the broker or cluster, or return the one already running from ``data_dir``
        (restarting any of its nodes that died).

        Returns once every node is registered in the cluster's metadata.

        Raises:
            JavaNotFoundError, KafkaJarsError: the prerequisites are missing.
            BrokerStartError: a process exited or the cluster did not answer within ``timeout_s`` seconds.
        """
        with self._lock():
            running = self.status()
            if running is not None:
                if len(running.nodes) != self.nodes:
                    raise BrokerStartError(f"a cluster of {len(running.nodes)} node(s) already runs from {self.data_dir}; "
                                           f"stop it (chandy kafka down) before starting {self.nodes}")
                dead = [n.node_id for n in running.nodes if not _pid_is_broker(n.pid)]
                for node_id in dead:
                    running = self._start_node(running, node_id)
                self._wait_ready(running, timeout_s, processes={i: _Pid(running.node(i).pid) for i in dead})
                return running
            if self.saved_layout and self.saved_layout != self._layout():
                raise BrokerStartError(
                    f"{self.data_dir} holds a cluster made with " + ", ".join(f"{k}={v}" for k, v in self.saved_layout.items())
                    + "; start it with those settings (or none), or use another --data-dir")
            java = find_java()
            libs = resolve_kafka_jars(self.kafka_version, self.cache_dir)
            credentials = self._credentials()
            ports = self._choose_ports()
            cluster_id = self._cluster_id()
            node_infos = []
            processes: dict[int, subprocess.Popen | _Pid] = {}
            for node_id in ports:
                properties = self._write_server_properties(node_id, ports, credentials)
                self._format_storage(java, libs, node_id, properties, cluster_id, credentials)
            self.layout_file.write_text(json.dumps(self._layout()))
            self.saved_layout = self._layout()
            try:
                for node_id, (port, controller_port) in ports.items():
                    properties = self.node_dir(node_id) / "server.properties"
                    process = self._launch(java, libs, node_id, properties)
                    processes[node_id] = process
                    node_infos.append(NodeInfo(node_id, process.pid, port, controller_port, str(self.node_dir(node_id)),
                                               str(self.node_dir(node_id) / "broker.log")))
                first = node_infos[0]
                info = BrokerInfo(pid=first.pid, port=first.port, controller_port=first.controller_port,
                                  kafka_version=self.kafka_version, data_dir=str(self.data_dir), log_file=first.log_file,
                                  started_at=time.time(), nodes=tuple(node_infos), security=self.security, tls=self.tls,
                                  client_settings=self._client_settings(credentials))
                self._write_info(info)
                self._wait_ready(info, timeout_s, processes=processes)
                self._add_scram_users(info, credentials)
            except BrokerStartError:
                for started in processes.values():
                    self._stop_pid(started.pid, timeout_s=10)
                self.info_file.unlink(missing_ok=True)
                raise
            return info

    def down(self, timeout_s: float = 30.0) -> bool:
        """Stop every node cleanly (SIGTERM, then SIGKILL after ``timeout_s`` seconds).

        Returns True when a node was running and all are now stopped, False when none was running.
        """
        with self._lock():
            info = self.status()
            if info is None:
                self.info_file.unlink(missing_ok=True)
                return False
            for node in info.nodes:  # SIGTERM to all first: they shut down together, not one by one
                with contextlib.suppress(ProcessLookupError):
                    if _pid_is_broker(node.pid):
                        os.kill(node.pid, signal.SIGTERM)
            for node in info.nodes:
                self._stop_pid(node.pid, timeout_s)
            self.info_file.unlink(missing_ok=True)
            return True

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` (default SIGKILL, ``kill -9``) to node ``node_id`` and wait until its
        process is gone. Returns the pid killed.

        Raises:
            KafkaLauncherError: no cluster runs from ``data_dir`` or it has no such node.
        """
        info = self.status()
        if info is None:
            raise KafkaLauncherError(f"no embedded Kafka runs from {self.data_dir}")
        pid = info.node(node_id).pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 30
        while _pid_is_broker(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        _reap(pid)
        return pid

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> BrokerInfo:
        """Start node ``node_id`` again (after :meth:`kill_node` or a crash) with its former
        ports and data; returns once the cluster's metadata lists it again.

        Raises:
            KafkaLauncherError: none was started from ``data_dir``; BrokerStartError: it did not come back.
        """
        with self._lock():
            info = self._read_info()  # every node may be down (a single broker that was killed)
            if info is None:
                raise KafkaLauncherError(f"no embedded Kafka was started from {self.data_dir}; start it with up()")
            self.nodes = len(info.nodes)  # the running cluster's layout, whatever this object was told
            info = self._start_node(info, node_id)
            self._wait_ready(info, timeout_s, processes={node_id: _Pid(info.node(node_id).pid)})
            return info

    # -- steps -------------------------------------------------------------------------------
    def _start_node(self, info: BrokerInfo, node_id: int) -> BrokerInfo:
        node = info.node(node_id)
        if _pid_is_broker(node.pid):
            return info
        # a node killed a moment ago leaves its sockets closing for a little while
        deadline = time.monotonic() + 60
        for port in (node.port, node.controller_port):
            while not _port_is_free(port):
                if time.monotonic() > deadline:
                    raise BrokerStartError(f"node {node_id} cannot restart: port 127.0.0.1:{port} is in use")
                time.sleep(0.2)
        process = self._launch(find_java(), resolve_kafka_jars(self.kafka_version, self.cache_dir), node_id,
                               self.node_dir(node_id) / "server.properties")
        nodes = tuple(dataclasses.replace(n, pid=process.pid) if n.node_id == node_id else n for n in info.nodes)
        info = dataclasses.replace(info, nodes=nodes, pid=nodes[0].pid)
        self._write_info(info)
        return info

    def _credentials(self) -> dict[str, str]:
        """User -> password of the admin and the SCRAM users (kept in ``credentials.json``, mode 0600)."""
        if self.security == "none" and not self.tls:
            return {}
        try:
            saved = json.loads(self.credentials_file.read_text())
        except (OSError, ValueError):
            saved = {}
        credentials = {ADMIN_USER: saved.get(ADMIN_USER) or secrets.token_urlsafe(18),
                       _TLS_PASSWORD: saved.get(_TLS_PASSWORD) or secrets.token_urlsafe(18), **saved, **self.scram_users}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.credentials_file.write_text(json.dumps(credentials, indent=2))
        self.credentials_file.chmod(0o600)
        return credentials

    def _client_settings(self, credentials: Mapping[str, str]) -> dict[str, str]:
        settings: dict[str, str] = {}
        if self.security == "sasl-scram":
            settings.update(kafka_config.sasl_settings(ADMIN_USER, credentials[ADMIN_USER], mechanism=SCRAM_MECHANISM,
                                                       protocol=self._listener_protocol()))
        if self.tls:
            settings.update({"security.protocol": self._listener_protocol(),
                             "ssl.ca.location": str(self.data_dir / "tls" / "ca.pem")})
        return settings

    def _add_scram_users(self, info: BrokerInfo, credentials: Mapping[str, str]) -> None:
        """Create (or update) the SCRAM users given on this start, e.g. on a cluster formatted
        before they were asked for (``AlterUserScramCredentials``, as ``kafka-configs --alter``)."""
        if not self.scram_users:
            return
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialAlteration,
            UserScramCredentialUpsertion,
        )

        admin = kafka_config.admin_client(info.bootstrap_servers, dict(info.client_settings))
        upserts: list[UserScramCredentialAlteration] = [UserScramCredentialUpsertion(name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                                password.encode()) for name, password in self.scram_users.items()]
        for name, future in admin.alter_user_scram_credentials(upserts).items():
            try:
                future.result()
            except KafkaException as exc:
                raise BrokerStartError(f"could not create SCRAM user {name}: {exc.args[0].str()}") from exc

    def _saved_ports(self, node_id: int) -> tuple[int, int] | None:
        properties = self.node_dir(node_id) / "server.properties"
        if not properties.exists():
            return None
        text = properties.read_text()
        port = re.search(r"^listeners=[A-Z_]+://127\.0\.0\.1:(\d+)", text, re.M)
        cport = re.search(r"CONTROLLER://127\.0\.0\.1:(\d+)", text)
        if port and cport:
            return int(port.group(1)), int(cport.group(1))
        return None

    def _choose_ports(self) -> dict[int, tuple[int, int]]:
        """node id -> (client port, controller port): the saved ones when all are free (a
        cluster's quorum is bound to its controller ports), else fresh free ones."""
        saved = {node_id: self._saved_ports(node_id) for node_id in range(1, self.nodes + 1)}
        known = {node_id: pair for node_id, pair in saved.items() if pair is not None}
        if len(known) == self.nodes and all(_port_is_free(p) for pair in known.values() for p in pair) and (
                self.port is None or known[1][0] == self.port):
            return known
        if self.port is not None and not _port_is_free(self.port):
            raise BrokerStartError(f"port 127.0.0.1:{self.port} is already in use")
        if self.nodes > 1 and any(saved.values()) and (self.node_dir(1) / "kraft" / "meta.properties").exists():
            raise BrokerStartError(f"the cluster in {self.data_dir} cannot restart: one of its saved ports is in use")
        taken: set[int] = {self.port} if self.port is not None else set()
        ports: dict[int, tuple[int, int]] = {}
        for node_id in range(1, self.nodes + 1):
            pair = []
            for _ in range(2):
                port = free_port()
                while port in taken:
                    port = free_port()
                taken.add(port)
                pair.append(port)
            if node_id == 1 and self.port is not None:
                pair[0] = self.port
            ports[node_id] = (pair[0], pair[1])
        return ports

    def _cluster_id(self) -> str:
        for node_id in range(1, self.nodes + 1):
            meta = self.node_dir(node_id) / "kraft" / "meta.properties"
            with contextlib.suppress(OSError):
                match = re.search(r"^cluster\.id=(\S+)", meta.read_text(), re.M)
                if match:
                    return match.group(1)
        return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()

    def _write_server_properties(self, node_id: int, ports: Mapping[int, tuple[int, int]],
                                 credentials: Mapping[str, str]) -> Path:
        port, controller_port = ports[node_id]
        replicas = str(min(3, self.nodes))
        min_isr = str(min(2, self.nodes))
        listener = self._listener_protocol()
        controller_protocol = "PLAINTEXT" if self.security == "none" else "SASL_PLAINTEXT"
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c) in sorted(ports.items())),
            "listeners": f"{listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:{controller_protocol}",
            "log.dirs": str(self.node_dir(node_id) / "kraft"),
            # one node: every internal topic has one replica; three or more: three, two in sync
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "min.insync.replicas": min_isr,
            "default.replication.factor": replicas,
            "group.initial.rebalance.delay.ms": "0",
            # a standby coordinator takes over within seconds: its election group's session timeout is 3 s
            # (Kafka's default minimum is 6 s; a production cluster sets it per the take-over it wants)
            "group.min.session.timeout.ms": "1000",
            # Chandy creates its topics with explicit settings; a typo must not create one
            "auto.create.topics.enable": "false",
            # compaction that a test or a demo can observe within seconds
            "log.cleaner.backoff.ms": "1000",
            "num.partitions": "1",
        }
        if self.security == "sasl-scram":
            admin_password = credentials[ADMIN_USER]
            settings.update({
                "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
                f"listener.name.{listener.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{ADMIN_USER}" password="{admin_password}";',
                # SCRAM credentials live in the metadata log: the controllers authenticate with PLAIN
                "sasl.mechanism.controller.protocol": "PLAIN",
                "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                "listener.name.controller.plain.sasl.jaas.config":
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{ADMIN_USER}" password="{admin_password}" user_{ADMIN_USER}="{admin_password}";',
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{ADMIN_USER}",
                "allow.everyone.if.no.acl.found": "false",
            })
        if self.tls:
            tls = self._tls_files(credentials)
            settings.update({
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(tls / "server.p12"),
                "ssl.keystore.password": credentials[_TLS_PASSWORD],
                "ssl.key.password": credentials[_TLS_PASSWORD],
                "ssl.truststore.type": "PKCS12",
                "ssl.truststore.location": str(tls / "truststore.p12"),
                "ssl.truststore.password": credentials[_TLS_PASSWORD],
                "ssl.client.auth": "none",
            })
        settings.update(self.broker_overrides)
        node_dir = self.node_dir(node_id)
        node_dir.mkdir(parents=True, exist_ok=True)
        path = node_dir / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        if self.security != "none" or self.tls:
            path.chmod(0o600)
        return path

    def _listener_protocol(self) -> str:
        """The client listener's security protocol (also its listener name)."""
        sasl = self.security == "sasl-scram"
        if self.tls:
            return "SASL_SSL" if sasl else "SSL"
        return "SASL_PLAINTEXT" if sasl else "PLAINTEXT"

    def _tls_files(self, credentials: Mapping[str, str]) -> Path:
        """``tls/server.p12`` (key and self-signed certificate for 127.0.0.1 and localhost),
        ``tls/truststore.p12`` and ``tls/ca.pem`` (that certificate), made once with keytool.

        Raises:
            KafkaLauncherError: keytool is missing or failed.
        """
        tls = self.data_dir / "tls"
        if (tls / "ca.pem").exists() and (tls / "truststore.p12").exists():
            return tls
        tls.mkdir(parents=True, exist_ok=True)
        java_home = Path(os.path.realpath(find_java())).parent
        keytool = str(java_home / "keytool") if (java_home / "keytool").exists() else shutil.which("keytool")
        if keytool is None:
            raise KafkaLauncherError("--tls needs the JDK's keytool (next to java, or on the PATH)")
        password = credentials[_TLS_PASSWORD]
        for f in ("server.p12", "truststore.p12", "ca.pem"):
            (tls / f).unlink(missing_ok=True)
        steps = [
            ["-genkeypair", "-keystore", str(tls / "server.p12"), "-storetype", "PKCS12", "-storepass", password,
             "-keypass", password, "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "365",
             "-dname", "CN=localhost", "-ext", "SAN=ip:127.0.0.1,dns:localhost"],
            ["-exportcert", "-rfc", "-keystore", str(tls / "server.p12"), "-storepass", password, "-alias", "broker",
             "-file", str(tls / "ca.pem")],
            ["-importcert", "-noprompt", "-keystore", str(tls / "truststore.p12"), "-storetype", "PKCS12",
             "-storepass", password, "-alias", "chandy-ca", "-file", str(tls / "ca.pem")],
        ]
        for step in steps:
            proc = subprocess.run([keytool, *step], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise KafkaLauncherError(f"keytool {step[0]} failed: {proc.stdout}{proc.stderr}")
        return tls

    def _format_storage(self, java: str, libs: Path, node_id: int, properties: Path, cluster_id: str,
                        credentials: Mapping[str, str]) -> None:
        kraft = self.node_dir(node_id) / "kraft"
        if (kraft / "meta.properties").exists():
            return
        scram = [f"--add-scram={SCRAM_MECHANISM}=[name={name},password={password}]"
                 for name, password in credentials.items() if name != _TLS_PASSWORD and self.security == "sasl-scram"]
        proc = subprocess.run(
            [java, "-cp", f"{libs}/*", *self._log_flags(node_id), _STORAGE_TOOL, "format",
             # "=" form: a base64 cluster id may start with "-", which would read as an option
             f"--cluster-id={cluster_id}", f"--config={properties}", *scram],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BrokerStartError(f"formatting KRaft storage in {kraft} failed: {proc.stdout}{proc.stderr}")

    def _log_flags(self, node_id: int) -> list[str]:
        log4j = resources.files("chandy") / "log4j2.properties"
        return [f"-Dlog4j2.configurationFile={log4j}", f"-Dchandy.log.file={self.node_dir(node_id) / 'broker.log'}"]

    def _launch(self, java: str, libs: Path, node_id: int, properties: Path) -> subprocess.Popen:
        out = open(self.node_dir(node_id) / "broker.out", "ab")
        command = [
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", *self._log_flags(node_id),
            "-cp", f"{libs}/*", _MAIN_CLASS, str(properties),
        ]
        # a session of its own: Ctrl-C in the shell that ran `chandy kafka up` leaves it running
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        out.close()
        return process

    def _wait_ready(self, info: BrokerInfo, timeout_s: float, processes: Mapping[int, subprocess.Popen | _Pid]) -> None:
        """Wait until the metadata lists every node whose process runs as a broker."""
        deadline = time.monotonic() + timeout_s
        # log_level 0: "connection refused" is expected until the broker listens, not worth printing
        admin = kafka_config.admin_client(
            info.bootstrap_servers, {"socket.connection.setup.timeout.ms": 1000, "log_level": 0, **info.client_settings}
        )
        while True:
            for node_id, process in processes.items():
                if process.poll() is not None:
                    raise BrokerStartError(
                        f"Kafka node {node_id} exited with code {process.returncode}; its log ends with:\n"
                        f"{self._log_tail(node_id)}"
                    )
            wanted = {n.node_id for n in info.nodes if _pid_is_broker(n.pid)}
            try:
                metadata = admin.list_topics(timeout=1.0)
                if metadata.brokers and wanted <= set(metadata.brokers) and all(
                        self._node_answers(info, node_id) for node_id in processes):
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the Kafka cluster at {info.bootstrap_servers} did not list nodes {sorted(wanted)} within "
                    f"{timeout_s:.0f} s; the log ends with:\n{self._log_tail(1)}"
                )
            time.sleep(0.2)

    @staticmethod
    def _node_answers(info: BrokerInfo, node_id: int) -> bool:
        """Whether node ``node_id`` itself answers a metadata request: the cluster's metadata
        keeps listing a killed node until its broker session times out, so a restart waits for
        the node's own answer."""
        node = info.node(node_id)
        admin = kafka_config.admin_client(f"127.0.0.1:{node.port}", {"socket.connection.setup.timeout.ms": 1000,
                                                                     "log_level": 0, **info.client_settings})
        try:
            return node_id in admin.list_topics(timeout=1.0).brokers
        except KafkaException:
            return False

    def _log_tail(self, node_id: int = 1, lines: int = 20) -> str:
        chunks = []
        for path in (self.node_dir(node_id) / "broker.out", self.node_dir(node_id) / "broker.log"):
            with contextlib.suppress(OSError):
                chunks.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(chunks[-lines:]) or "(empty)"

    @staticmethod
    def _stop_pid(pid: int, timeout_s: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _pid_is_broker(pid):
                _reap(pid)
                return
            _reap(pid)
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)


class _Pid:
    """A node process started by an earlier call, watched like a :class:`subprocess.Popen`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """None while the process lives; its exit status (or -1 when not our child) once gone."""
        if self.returncode is not None:
            return self.returncode
        with contextlib.suppress(ChildProcessError, OSError):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                return self.returncode
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = -1
            return self.returncode
        with contextlib.suppress(OSError):
            if Path(f"/proc/{self.pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                self.returncode = -1
        return self.returncode


def _reap(pid: int) -> None:
    """Collect the exit status when the broker is our own child, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
