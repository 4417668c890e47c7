"""A node's configuration: ports, cluster ID, ``server.properties``, SASL/SCRAM credentials and
TLS files, and :class:`BrokerInfo`, what a running cluster records of itself (the configuration
side of :class:`~chandy.broker.cluster.EmbeddedKafkaBroker`)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException

from chandy.broker.distribution import BrokerStartError, KafkaLauncherError, find_java
from chandy.coordinator.kafka import config as kafka_config

SECURITY_MODES = ("none", "sasl-scram")
#: The SCRAM mechanism the embedded broker enables (librdkafka's ``sasl.mechanism`` value).
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The super user (``super.users``) the embedded broker creates for itself and its administrators.
ADMIN_USER = "admin"
#: The key in ``credentials.json`` of the TLS key and trust stores' password (not a user).
TLS_PASSWORD_KEY = "$tls-store"



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




def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class NodeConfiguration:
    """The configuration side of :class:`~chandy.broker.cluster.EmbeddedKafkaBroker` (a mixin:
    the attributes below are the broker's)."""

    data_dir: Path
    nodes: int
    port: int | None
    security: str
    tls: bool
    scram_users: dict[str, str]
    broker_overrides: dict[str, str]

    @property
    def credentials_file(self) -> Path:
        raise NotImplementedError

    def node_dir(self, node_id: int) -> Path:
        raise NotImplementedError

    def _credentials(self) -> dict[str, str]:
        """User -> password of the admin and the SCRAM users (kept in ``credentials.json``, mode 0600)."""
        if self.security == "none" and not self.tls:
            return {}
        try:
            saved = json.loads(self.credentials_file.read_text())
        except (OSError, ValueError):
            saved = {}
        credentials = {ADMIN_USER: saved.get(ADMIN_USER) or secrets.token_urlsafe(18),
                       TLS_PASSWORD_KEY: saved.get(TLS_PASSWORD_KEY) or secrets.token_urlsafe(18), **saved, **self.scram_users}
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
        if len(known) == self.nodes and all(port_is_free(p) for pair in known.values() for p in pair) and (
                self.port is None or known[1][0] == self.port):
            return known
        if self.port is not None and not port_is_free(self.port):
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
                "ssl.keystore.password": credentials[TLS_PASSWORD_KEY],
                "ssl.key.password": credentials[TLS_PASSWORD_KEY],
                "ssl.truststore.type": "PKCS12",
                "ssl.truststore.location": str(tls / "truststore.p12"),
                "ssl.truststore.password": credentials[TLS_PASSWORD_KEY],
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
        password = credentials[TLS_PASSWORD_KEY]
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

