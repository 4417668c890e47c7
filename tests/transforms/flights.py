"""A user transform for the pipeline tests: DataFrame in, DataFrame out."""

from pyspark.sql import functions as F


def late_only(df):
    """Keep delayed flights and add a column; the exactly-once columns stay."""
    return df.where(F.col("dep_delay") > 0).withColumn("late_by", F.col("dep_delay") * 60)


def identity(df):
    """The DataFrame as it is (a transform that hides the output schema until the data flows)."""
    return df
