"""The ``chandy`` command line: it only parses arguments and calls the library. One module per
command group (:mod:`chandy.cli.kafka`, :mod:`chandy.cli.pipeline`, :mod:`chandy.cli.jobs`,
:mod:`chandy.cli.lake`, :mod:`chandy.cli.log`, :mod:`chandy.cli.events`, :mod:`chandy.cli.topics`),
each registering its commands on :func:`chandy.cli.app.main`.
"""

from chandy.cli import events, jobs, kafka, lake, log, pipeline, topics  # noqa: F401 - registers the commands
from chandy.cli.app import main

__all__ = ["main"]
