"""The pipeline's driver, under the name callers import it by: :class:`Pipeline` lives in
:mod:`chandy.connectors.spark.driver.pipeline`, which describes the job and the driver's parts."""

from __future__ import annotations

from chandy.connectors.spark.driver.pipeline import Pipeline

__all__ = ["Pipeline"]
