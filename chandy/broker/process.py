"""A node's JVM: formatting its storage, launching it, waiting until it answers, stopping it,
and finding free ports (the process side of :class:`~chandy.broker.cluster.EmbeddedKafkaBroker`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from confluent_kafka import KafkaException

from chandy.broker.config import SCRAM_MECHANISM, TLS_PASSWORD_KEY, BrokerInfo
from chandy.broker.distribution import BrokerStartError
from chandy.coordinator.kafka import config as kafka_config

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"


def pid_is_broker(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid
    return MAIN_CLASS.encode() in cmdline




class NodeProcesses:
    """The JVM side of :class:`~chandy.broker.cluster.EmbeddedKafkaBroker` (a mixin: the attributes
    below are the broker's)."""

    data_dir: Path
    heap: str
    security: str

    def node_dir(self, node_id: int) -> Path:
        raise NotImplementedError

    def _format_storage(self, java: str, libs: Path, node_id: int, properties: Path, cluster_id: str,
                        credentials: Mapping[str, str]) -> None:
        kraft = self.node_dir(node_id) / "kraft"
        if (kraft / "meta.properties").exists():
            return
        scram = [f"--add-scram={SCRAM_MECHANISM}=[name={name},password={password}]"
                 for name, password in credentials.items() if name != TLS_PASSWORD_KEY and self.security == "sasl-scram"]
        proc = subprocess.run(
            [java, "-cp", f"{libs}/*", *self._log_flags(node_id), STORAGE_TOOL, "format",
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
            "-cp", f"{libs}/*", MAIN_CLASS, str(properties),
        ]
        # a session of its own: Ctrl-C in the shell that ran `chandy kafka up` leaves it running
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        out.close()
        return process

    def _wait_ready(self, info: BrokerInfo, timeout_s: float, processes: Mapping[int, subprocess.Popen | NodePid]) -> None:
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
            wanted = {n.node_id for n in info.nodes if pid_is_broker(n.pid)}
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
            if not pid_is_broker(pid):
                reap(pid)
                return
            reap(pid)
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        reap(pid)



class NodePid:
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


def reap(pid: int) -> None:
    """Collect the exit status when the broker is our own child, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
