"""The pipeline's driver: :class:`~chandy.connectors.spark.driver.pipeline.Pipeline` and its
collaborators, one module each, sharing one :class:`~chandy.connectors.spark.driver.state.DriverState`:

- :mod:`~.pipeline`: the orchestrator (the run, its attempts, a standby's wait);
- :mod:`~.loop`: one attempt's checkpoint loop (``CheckpointLoop``);
- :mod:`~.micro_batch`: one checkpoint's Spark job (``MicroBatchRunner``);
- :mod:`~.source`: the source's lag, data loss and ending offsets (``SourceOffsets``);
- :mod:`~.coordinator`: the coordinator service, dead letters, FAILED records (``JobCoordinator``);
- :mod:`~.requests`: control requests between micro-batches (``RequestExecutor``);
- :mod:`~.preflight`: the checks before Spark starts, the reconciliation (``Preflight``);
- :mod:`~.decoders`: the value decoder a job's options give (``DecoderFactory``);
- :mod:`~.session`: the Spark session, its warm workers, the signal handlers (``SparkSessionManager``);
- :mod:`~.restarts`: Flink's restart strategy and its decisions (``Restarts``);
- :mod:`~.failures`: a Spark failure's root cause, and whether a restart can cure it;
- :mod:`~.metrics`: the pipeline's Prometheus gauges (``PipelineMetricsCollector``);
- :mod:`~.state`: what they share (``DriverState``).

The Spark task side (:mod:`chandy.connectors.spark.task`) never imports this package (an import
contract in ``pyproject.toml``); the settings (:mod:`chandy.connectors.spark.options`) and the
Spark helpers the tasks or the CLI share (``cluster``, ``classic``, ``spark_urls``, ``ddl``,
``progress``, ``verify``) stay in :mod:`chandy.connectors.spark`.
"""
