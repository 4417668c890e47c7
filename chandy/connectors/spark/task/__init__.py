"""What runs inside a Spark task, in the order the data flows: :mod:`~.read` (a subtask's offset
ranges from Kafka), :mod:`~.decode` (with :mod:`~.route` when each routed table decodes with its
own writer schemas; bad records to :mod:`~.dead_letters`), :mod:`~.write` (lake files, a bounded
part at a time, into the tables of :mod:`~.tables`), :mod:`~.acknowledge` (the checkpoint's ack
or decline); :mod:`~.run` chains them for one subtask, :mod:`~.datasources` exposes read and
write as Spark data sources for the ``--transform`` path, :mod:`~.options` is what the driver
hands the tasks, :mod:`~.clients` the Kafka clients and sinks pooled per worker process. Nothing
here imports the driver."""
