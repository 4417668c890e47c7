"""JSON values into Arrow columns, a batch at a time (Arrow's JSON reader, what a pipeline task
does) next to record by record (``json.loads`` and the type mapping's converters, what it did
before, and what ``--verify`` still does), in one process, on the throughput benchmark's
12-field records (:mod:`benchmarks.decoded_records`).

Run: ``.venv/bin/python benchmarks/json_decode.py [--records 50000] [--repeats 5]``. Prints the
median records/s of each path over the repeats and the ratio; no servers, no Spark.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from benchmarks.decoded_records import JSON_DDL, value_encoder
from chandy.connectors.spark.ddl import parse_ddl
from chandy.connectors.spark.decode import ValueDecoder
from chandy.connectors.spark.records import ARROW_SCHEMA


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000, help="records per batch")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    encode = value_encoder("json")
    values = [encode(i) for i in range(args.records)]
    batch = pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": "t", "partition": 0, "offset": i, "timestamp": None,
          "timestamp_type": 0, "headers": []} for i, v in enumerate(values)], schema=ARROW_SCHEMA)
    columns = to_arrow_schema(parse_ddl(JSON_DDL), timezone="UTC")
    decoder = ValueDecoder("json", columns, tuple(columns.names), ("topic", "partition", "offset", "timestamp"))
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
    print(f"{args.records:,} JSON records of {len(values[0])} bytes, 12 fields, median of {args.repeats}")
    print(f"record by record (json.loads + type mapping): {rates[False]:>12,.0f} records/s")
    print(f"a batch at a time (Arrow's JSON reader):      {rates[True]:>12,.0f} records/s")
    print(f"ratio: {rates[True] / rates[False]:.2f}")


if __name__ == "__main__":
    main()
