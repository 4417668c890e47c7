"""One import name (issue 26): the wheel built from the repository installs ``chandy`` alone
(its coordinator, connectors and schemas as ``chandy.coordinator``, ``chandy.connectors``,
``chandy.schemas``, the Avro schemas included), so no generic top-level name (``schemas``,
``connectors``, ``coordinator``) can shadow or be shadowed by another distribution's."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.fixtures import REPO_ROOT

ROOT = REPO_ROOT


def test_the_wheel_installs_one_top_level_name_and_imports_from_it_alone(tmp_path: Path) -> None:
    # as a user builds it: ``python -m build`` (in an isolated environment with setuptools from PyPI)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("chandy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"chandy"}
    assert "chandy/schemas/chandy.v1.AcknowledgeCheckpoint.avsc" in names
    assert {"chandy/coordinator/__init__.py", "chandy/connectors/__init__.py", "chandy/schemas/__init__.py"} <= set(names)
    # installed alone (the dependencies from this environment's site-packages as a plain path, no
    # editable finder): chandy and its layers import, the old top-level names do not
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    script = ("import sys; sys.path[:0] = sys.argv[1:3]\n"
              "import chandy, chandy.coordinator.kafka.runtime, chandy.connectors.lake.tables\n"
              "from chandy.schemas.codec import default_repository\n"
              "assert len(default_repository().names()) > 10\n"
              "for name in ('coordinator', 'connectors', 'schemas'):\n"
              "    try:\n"
              "        __import__(name)\n"
              "    except ModuleNotFoundError:\n"
              "        continue\n"
              "    raise SystemExit(f'{name} imports')\n"
              "print(chandy.__file__)\n")
    probe = subprocess.run([sys.executable, "-S", "-c", script, str(target), sysconfig.get_paths()["purelib"]],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip().startswith(str(target))
