"""The light local Spark session the Spark tests share: 2 cores, no UI, no Hive, small
shuffles, the serial GC. PySpark starts its Python workers with $PYSPARK_PYTHON (read when the
context starts), so it names this interpreter (the one with recd installed)."""

from __future__ import annotations

import os
import sys
from typing import Any


def light_local_spark(master: str, app_name: str) -> tuple[Any, str | None]:
    """A session on ``master`` (e.g. ``local[2]``) and the ``PYSPARK_PYTHON`` it replaced,
    for :func:`restore_pyspark_python` once the session is stopped."""
    from pyspark.sql import SparkSession

    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session, saved


def restore_pyspark_python(saved: str | None) -> None:
    if saved is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = saved
