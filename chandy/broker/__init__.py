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

from chandy.broker.cluster import EmbeddedKafkaBroker
from chandy.broker.config import ADMIN_USER, SCRAM_MECHANISM, SECURITY_MODES, BrokerInfo, NodeInfo, free_port
from chandy.broker.distribution import (
    KAFKA_LIBS_ENV,
    KAFKA_VERSION,
    MIN_JAVA_VERSION,
    BrokerStartError,
    JavaNotFoundError,
    KafkaJarsError,
    KafkaLauncherError,
    default_cache_dir,
    default_data_dir,
    find_java,
    resolve_kafka_jars,
)

__all__ = ["ADMIN_USER", "KAFKA_LIBS_ENV", "KAFKA_VERSION", "MIN_JAVA_VERSION", "SCRAM_MECHANISM", "SECURITY_MODES",
           "BrokerInfo", "BrokerStartError", "EmbeddedKafkaBroker", "JavaNotFoundError", "KafkaJarsError",
           "KafkaLauncherError", "NodeInfo", "default_cache_dir", "default_data_dir", "find_java", "free_port",
           "resolve_kafka_jars"]
