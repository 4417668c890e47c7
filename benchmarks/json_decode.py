"""Values into Arrow columns, a batch at a time (what a pipeline task does) next to record by
record (what it did before, and what it still does for a batch with a bad record), in one
process, on the throughput benchmark's 12-field records (:mod:`benchmarks.decoded_records`):

- ``json``: Arrow's JSON reader next to ``json.loads`` and the type mapping's converters;
- ``avro``: the numpy batch decoder (:mod:`chandy.formats.avro_batch`) next to
  fastavro's ``schemaless_reader`` (plain Avro binary, the benchmark's schema);
- ``protobuf``: the numpy wire-format reader (:mod:`chandy.formats.protobuf_batch`,
  :mod:`chandy.formats.protobuf_wire`) next to protobuf's runtime parsing each value into a dict
  per record (Confluent framing, the schema in confluent-kafka's in-process ``mock://`` registry).

Run: ``.venv/bin/python benchmarks/json_decode.py [--value-format json|avro|protobuf] [--records
50000] [--repeats 5]``. Prints the median records/s of each path over the repeats and the ratio,
after checking that both land the same values; no servers, no Spark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from benchmarks.decoded_records import AVRO_SCHEMA, JSON_DDL, use_registry, value_encoder
from chandy.formats.decoder import ValueDecoder
from chandy.formats.records import ARROW_SCHEMA

KEEP = ("topic", "partition", "offset", "timestamp")
PATHS = {"json": ("json.loads + type mapping", "Arrow's JSON reader"),
         "avro": ("fastavro schemaless_reader + type mapping", "numpy batch decoder"),
         "protobuf": ("protobuf runtime, a dict per record", "the wire format read a batch at a time with numpy")}


def decoder_for(value_format: str) -> ValueDecoder:
    """The pipeline's decoder of the benchmark's records in ``value_format``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if value_format == "json":
        from chandy.connectors.spark.ddl import parse_ddl

        columns = to_arrow_schema(parse_ddl(JSON_DDL), timezone="UTC")
        return ValueDecoder("json", columns, tuple(columns.names), KEEP)
    if value_format == "avro":
        from chandy.formats.avro import avro_columns

        columns, names = avro_columns(AVRO_SCHEMA)
        return ValueDecoder("avro", columns, names, KEEP, avro_schema=json.dumps(AVRO_SCHEMA), avro_framing="raw")
    from chandy.formats.protobuf import arrow_columns, message_descriptor
    from chandy.formats.registry import registry_client

    registry = registry_client({"url": "mock://chandy-decode-bench"})
    latest = registry.get_latest_version("decode-bench-value")
    columns, names = arrow_columns(message_descriptor(registry, latest.schema_id, [0]))
    return ValueDecoder("protobuf", columns, names, KEEP, schema_registry=(("url", "mock://chandy-decode-bench"),),
                        as_written=True, columns_schema_id=latest.schema_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--value-format", choices=tuple(PATHS), default="json")
    parser.add_argument("--records", type=int, default=50_000, help="records per batch")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.value_format == "protobuf":
        use_registry("mock://chandy-decode-bench", Path("/dev/null"))
    encode = value_encoder(args.value_format, "decode-bench")
    values = [encode(i) for i in range(args.records)]
    batch = pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": "t", "partition": 0, "offset": i, "timestamp": None,
          "timestamp_type": 0, "headers": []} for i, v in enumerate(values)], schema=ARROW_SCHEMA)
    decoder = decoder_for(args.value_format)
    rates = {}
    outputs = {}
    for vectorized in (False, True):
        seconds = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            outputs[vectorized], bad, _ = decoder.decode(batch, vectorized=vectorized)
            seconds.append(time.perf_counter() - started)
            assert bad is None
        rates[vectorized] = args.records / statistics.median(seconds)
    assert outputs[True].equals(outputs[False]), "the two paths landed different values"
    slow, fast = PATHS[args.value_format]
    print(f"{args.records:,} {args.value_format} records of about {len(values[0])} bytes, 12 fields, "
          f"median of {args.repeats}, pyarrow {pa.__version__}")
    print(f"record by record ({slow}): {rates[False]:>12,.0f} records/s")
    print(f"a batch at a time ({fast}): {rates[True]:>12,.0f} records/s")
    print(f"ratio: {rates[True] / rates[False]:.2f}")


if __name__ == "__main__":
    main()
