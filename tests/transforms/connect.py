"""A user transform for the Spark Connect tests: DataFrame operations only, as Spark Connect runs them."""

from pyspark.sql import functions as F


def with_doubled_amount(df):
    """Add ``amount_x2`` (``amount`` times 2) and an upper-case ``name_upper``; the exactly-once columns stay."""
    return df.withColumn("amount_x2", F.col("amount") * 2).withColumn("name_upper", F.upper("name"))
