"""Issue 33: the CLI's output into a pipe or a file is not hard-wrapped at 80 columns (rich's
default off a terminal): one record per line, a table row on one line whatever its width."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures import REPO_ROOT

SCRIPT = """
from rich.table import Table
from chandy.cli.app import console, err_console
table = Table("checkpoint", "pointer")
table.add_row("7", "s3://bucket/checkpoints/" + "j" * 32 + "/chk-7/_metadata" + "/x" * 60)
console.print(table)
err_console.print("error: " + "the field amount is DECIMAL(12,2) in the table but STRING in the data; " * 3)
"""


def test_output_into_a_pipe_keeps_each_record_on_one_line() -> None:
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if "chk-7" in line]
    assert len(rows) == 1 and rows[0].rstrip().endswith("│") and len(rows[0]) > 200, run.stdout
    errors = run.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and len(errors[0]) > 200, run.stderr
