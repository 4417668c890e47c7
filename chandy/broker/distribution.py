"""The Apache Kafka distribution the embedded broker runs: the pinned release, its jars (resolved
from Maven Central with Maven and the ``pom.xml`` beside the package, cached per version), Java,
and the launcher's errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import platformdirs

from chandy.coordinator.errors import ChandyError

#: The pinned Apache Kafka release (Maven Central ``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.1.0"
#: Oldest Java feature release the broker runs on.
MIN_JAVA_VERSION = 17
#: Environment variable naming a directory of Kafka jars to use instead of resolving them.
KAFKA_LIBS_ENV = "CHANDY_KAFKA_LIBS"



class KafkaLauncherError(ChandyError):
    """The embedded broker could not be prepared, started or stopped."""


class JavaNotFoundError(KafkaLauncherError):
    """No Java 17+ runtime was found (``JAVA_HOME`` or ``java`` on the PATH)."""


class KafkaJarsError(KafkaLauncherError):
    """The Apache Kafka jars could not be resolved from Maven Central."""


class BrokerStartError(KafkaLauncherError):
    """The broker process exited or did not answer in time; the message holds its log's tail."""




def default_data_dir() -> Path:
    """``<user state dir>/chandy/kafka``: where ``chandy kafka up`` keeps the broker by default."""
    return Path(platformdirs.user_state_dir("chandy")) / "kafka"


def default_cache_dir() -> Path:
    """``<user cache dir>/chandy``: where resolved Kafka jars are cached, one folder per version."""
    return Path(platformdirs.user_cache_dir("chandy"))



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


