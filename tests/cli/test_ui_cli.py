"""Bad arguments to `chandy ui` and the --metrics-port options exit 2 with a message naming the
option, before anything is started (no broker is reached)."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from chandy.cli import main

NO_BROKER = ["-b", "127.0.0.1:9"]  # nothing listens there; none of these commands gets that far


@pytest.mark.parametrize("args, words", [
    (["ui", "--port", "70000", *NO_BROKER], "--port"),
    (["ui", "--port", "-1", *NO_BROKER], "--port"),
    (["ui", "--history-size", "0", *NO_BROKER], "--history-size"),
    (["ui", "-X", "no-equals-sign", *NO_BROKER], "-X"),
    (["ui", "--no-such-option"], "--no-such-option"),
    (["checkpoint", "demo", "--metrics-port", "65536", *NO_BROKER], "--metrics-port"),
    (["checkpoint", "demo", "--pause-ms", "-5", *NO_BROKER], "--pause-ms"),
    (["pipeline", "run", "--table", "t", "--topic", "x", "--metrics-port", "abc", *NO_BROKER], "--metrics-port"),
    (["demo", "--metrics-port", "-2"], "--metrics-port"),
])
def test_bad_arguments_exit_2_naming_the_option(args, words):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_ui_on_a_taken_port_exits_2_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["ui", "--port", str(port), *NO_BROKER])
    assert result.exit_code == 2
    assert f"error: cannot serve the UI on 127.0.0.1:{port}" in result.output
