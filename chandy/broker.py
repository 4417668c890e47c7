"""The embedded Apache Kafka broker: one KRaft node from the official Apache Kafka jars.

``chandy kafka up | down | status`` and the test fixture both use :class:`EmbeddedKafkaBroker`.
The jars of a pinned Apache Kafka release are resolved from Maven Central with Maven (the
``pom.xml`` beside this module) and cached under the user's cache directory; Java 17 or newer is
the only system requirement besides Maven. The broker binds to 127.0.0.1 only, keeps its data
and its log in one directory, and runs with the settings a single node needs (replication factor
1 and min ISR 1 for the offsets and transaction state topics).

State kept in the data directory:

- ``server.properties``: the broker configuration written at first start;
- ``broker.json``: pid, ports and version of the running broker (see :class:`BrokerInfo`);
- ``broker.log``: the broker's log4j2 log; ``broker.out``: its stdout/stderr;
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

from coordinator.errors import ChandyError
from coordinator.kafka import config as kafka_config

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


@dataclasses.dataclass(frozen=True)
class BrokerInfo:
    """What ``broker.json`` records about a running embedded broker.

    ``port`` is the client listener and ``controller_port`` the KRaft controller listener, both
    on 127.0.0.1; ``started_at`` is a Unix time in seconds.
    """

    pid: int
    port: int
    controller_port: int
    kafka_version: str
    data_dir: str
    log_file: str
    started_at: float

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``, the value for ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"


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
    """A single-node Apache Kafka broker in KRaft mode, bound to 127.0.0.1.

    Args:
        data_dir: where configuration, KRaft metadata, topic logs and logs live
            (default :func:`default_data_dir`).
        port: client port; default: the port of the last start if still free, else a free one.
        kafka_version: the Apache Kafka release to run (default :data:`KAFKA_VERSION`).
        cache_dir: jar cache root (default :func:`default_cache_dir`).
        heap: JVM heap size for ``-Xmx`` (default ``512m``).
        broker_overrides: broker properties under their standard names, written into
            ``server.properties`` over Chandy's defaults at first start.

    ``up()`` is idempotent and guarded by a file lock, so two concurrent callers share one broker.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        kafka_version: str = KAFKA_VERSION,
        cache_dir: Path | None = None,
        heap: str = "512m",
        broker_overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.port = port
        self.kafka_version = kafka_version
        self.cache_dir = cache_dir
        self.heap = heap
        self.broker_overrides = dict(broker_overrides or {})

    # -- files -------------------------------------------------------------------------------
    @property
    def info_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def out_file(self) -> Path:
        return self.data_dir / "broker.out"

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
            return BrokerInfo(**json.loads(self.info_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    # -- public API --------------------------------------------------------------------------
    def status(self) -> BrokerInfo | None:
        """The running broker's :class:`BrokerInfo`, or None when none runs from ``data_dir``."""
        info = self._read_info()
        if info is None or not _pid_is_broker(info.pid):
            return None
        return info

    def up(self, timeout_s: float = 120.0) -> BrokerInfo:
        """Start the broker, or return the one already running from ``data_dir``.

        Returns once the broker answers an AdminClient metadata request.

        Raises:
            JavaNotFoundError, KafkaJarsError: the prerequisites are missing.
            BrokerStartError: the process exited or did not answer within ``timeout_s`` seconds.
        """
        with self._lock():
            running = self.status()
            if running is not None:
                self._wait_ready(running, timeout_s, process=None)
                return running
            java = find_java()
            libs = resolve_kafka_jars(self.kafka_version, self.cache_dir)
            port, controller_port = self._choose_ports()
            properties = self._write_server_properties(port, controller_port)
            self._format_storage(java, libs, properties)
            info, process = self._launch(java, libs, properties, port, controller_port)
            try:
                self._wait_ready(info, timeout_s, process=process)
            except BrokerStartError:
                self._stop_pid(info.pid, timeout_s=10)
                self.info_file.unlink(missing_ok=True)
                raise
            return info

    def down(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after ``timeout_s`` seconds).

        Returns True when a broker was running and is now stopped, False when none was running.
        """
        with self._lock():
            info = self.status()
            if info is None:
                self.info_file.unlink(missing_ok=True)
                return False
            self._stop_pid(info.pid, timeout_s)
            self.info_file.unlink(missing_ok=True)
            return True

    # -- steps -------------------------------------------------------------------------------
    def _saved_ports(self) -> tuple[int, int] | None:
        properties = self.data_dir / "server.properties"
        if not properties.exists():
            return None
        text = properties.read_text()
        port = re.search(r"^listeners=PLAINTEXT://127\.0\.0\.1:(\d+)", text, re.M)
        cport = re.search(r"CONTROLLER://127\.0\.0\.1:(\d+)", text)
        if port and cport:
            return int(port.group(1)), int(cport.group(1))
        return None

    def _choose_ports(self) -> tuple[int, int]:
        saved = self._saved_ports()
        if self.port is not None:
            if not _port_is_free(self.port):
                raise BrokerStartError(f"port 127.0.0.1:{self.port} is already in use")
            controller = saved[1] if saved and _port_is_free(saved[1]) else free_port()
            return self.port, controller
        if saved and all(_port_is_free(p) for p in saved):
            return saved
        return free_port(), free_port()

    def _write_server_properties(self, port: int, controller_port: int) -> Path:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "kraft"),
            # a single node: every internal topic has one replica and needs one in sync
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "default.replication.factor": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Chandy creates its topics with explicit settings; a typo must not create one
            "auto.create.topics.enable": "false",
            # compaction that a test or a demo can observe within seconds
            "log.cleaner.backoff.ms": "1000",
            "num.partitions": "1",
        }
        settings.update(self.broker_overrides)
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _format_storage(self, java: str, libs: Path, properties: Path) -> None:
        kraft = self.data_dir / "kraft"
        if (kraft / "meta.properties").exists():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        proc = subprocess.run(
            [java, "-cp", f"{libs}/*", *self._log_flags(), _STORAGE_TOOL, "format",
             # "=" form: a base64 cluster id may start with "-", which would read as an option
             f"--cluster-id={cluster_id}", f"--config={properties}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BrokerStartError(f"formatting KRaft storage in {kraft} failed: {proc.stdout}{proc.stderr}")

    def _log_flags(self) -> list[str]:
        log4j = resources.files("chandy") / "log4j2.properties"
        return [f"-Dlog4j2.configurationFile={log4j}", f"-Dchandy.log.file={self.log_file}"]

    def _launch(
        self, java: str, libs: Path, properties: Path, port: int, controller_port: int
    ) -> tuple[BrokerInfo, subprocess.Popen]:
        out = open(self.out_file, "ab")
        command = [
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", *self._log_flags(),
            "-cp", f"{libs}/*", _MAIN_CLASS, str(properties),
        ]
        # a session of its own: Ctrl-C in the shell that ran `chandy kafka up` leaves it running
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        out.close()
        info = BrokerInfo(
            pid=process.pid,
            port=port,
            controller_port=controller_port,
            kafka_version=self.kafka_version,
            data_dir=str(self.data_dir),
            log_file=str(self.log_file),
            started_at=time.time(),
        )
        self.info_file.write_text(json.dumps(dataclasses.asdict(info), indent=2))
        return info, process

    def _wait_ready(self, info: BrokerInfo, timeout_s: float, process: subprocess.Popen | None) -> None:
        deadline = time.monotonic() + timeout_s
        # log_level 0: "connection refused" is expected until the broker listens, not worth printing
        admin = kafka_config.admin_client(
            info.bootstrap_servers, {"socket.connection.setup.timeout.ms": 1000, "log_level": 0}
        )
        while True:
            if process is not None and process.poll() is not None:
                raise BrokerStartError(
                    f"the Kafka broker exited with code {process.returncode}; its log ends with:\n{self._log_tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=1.0)
                if metadata.brokers:
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the Kafka broker at {info.bootstrap_servers} did not answer within {timeout_s:.0f} s; "
                    f"its log ends with:\n{self._log_tail()}"
                )
            time.sleep(0.2)

    def _log_tail(self, lines: int = 20) -> str:
        chunks = []
        for path in (self.out_file, self.log_file):
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
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> None:
    """Collect the exit status when the broker is our own child, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
