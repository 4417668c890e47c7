"""The embedded Kafka cluster: :class:`EmbeddedKafkaBroker`'s lifecycle (up, down, status, a
node's kill and restart), its layout and its lock; configuration and processes are its mixins'."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from chandy.broker.config import SECURITY_MODES, BrokerInfo, NodeConfiguration, NodeInfo, port_is_free
from chandy.broker.distribution import (
    KAFKA_VERSION,
    BrokerStartError,
    KafkaLauncherError,
    default_data_dir,
    find_java,
    resolve_kafka_jars,
)
from chandy.broker.process import NodePid, NodeProcesses, pid_is_broker, reap


class EmbeddedKafkaBroker(NodeConfiguration, NodeProcesses):
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
        if info is None or not any(pid_is_broker(node.pid) for node in info.nodes):
            return None
        return info

    def alive_nodes(self) -> list[int]:
        """The ``node.id`` of every node whose process runs now (empty when none does)."""
        info = self._read_info()
        return [] if info is None else [node.node_id for node in info.nodes if pid_is_broker(node.pid)]

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
                dead = [n.node_id for n in running.nodes if not pid_is_broker(n.pid)]
                for node_id in dead:
                    running = self._start_node(running, node_id)
                self._wait_ready(running, timeout_s, processes={i: NodePid(running.node(i).pid) for i in dead})
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
            processes: dict[int, subprocess.Popen | NodePid] = {}
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
                    if pid_is_broker(node.pid):
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
        while pid_is_broker(pid) and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.05)
        reap(pid)
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
            self._wait_ready(info, timeout_s, processes={node_id: NodePid(info.node(node_id).pid)})
            return info

    # -- steps -------------------------------------------------------------------------------
    def _start_node(self, info: BrokerInfo, node_id: int) -> BrokerInfo:
        node = info.node(node_id)
        if pid_is_broker(node.pid):
            return info
        # a node killed a moment ago leaves its sockets closing for a little while
        deadline = time.monotonic() + 60
        for port in (node.port, node.controller_port):
            while not port_is_free(port):
                if time.monotonic() > deadline:
                    raise BrokerStartError(f"node {node_id} cannot restart: port 127.0.0.1:{port} is in use")
                time.sleep(0.2)
        process = self._launch(find_java(), resolve_kafka_jars(self.kafka_version, self.cache_dir), node_id,
                               self.node_dir(node_id) / "server.properties")
        nodes = tuple(dataclasses.replace(n, pid=process.pid) if n.node_id == node_id else n for n in info.nodes)
        info = dataclasses.replace(info, nodes=nodes, pid=nodes[0].pid)
        self._write_info(info)
        return info

