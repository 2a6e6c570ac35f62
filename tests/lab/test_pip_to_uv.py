"""tools/pip_to_uv.py: `make setup` hands uv the indexes pip is configured with."""
from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO
from tools.pip_to_uv import uv_flags

# `pip config list` on a lab machine: a local wheel folder (the CPU torch) twice, in pip.conf and
# as PIP_FIND_LINKS, two local indexes in one value, and settings uv has no use for
LAB_MACHINE = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_the_lab_machines_settings():
    assert uv_flags(LAB_MACHINE) == [
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels"]


def test_the_strongest_setting_wins_as_in_pip():
    """The README's hint (PIP_EXTRA_INDEX_URL) replaces pip.conf's extra indexes, and [install]
    beats [global]; a section pip has not for install is ignored."""
    listed = ("global.extra-index-url='file:///opt/pypi/simple'\n"
              "global.index-url='https://mirror.example/simple'\n"
              "install.index-url='https://other.example/simple'\n"
              ":env:.extra-index-url='https://download.pytorch.org/whl/cpu'\n"
              "download.find-links='/only/for/pip/download'\n")
    assert uv_flags(listed) == ["--index-url", "https://other.example/simple",
                                "--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert uv_flags("") == []


def test_it_reads_pip_of_the_environment_it_runs_in():
    env_hint = {"PIP_EXTRA_INDEX_URL": "https://download.pytorch.org/whl/cpu", "PATH": "/usr/bin"}
    out = subprocess.run([sys.executable, "-m", "tools.pip_to_uv"], cwd=REPO, env=env_hint,
                         capture_output=True, text=True, timeout=60).stdout
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in out


def test_it_takes_no_arguments():
    proc = subprocess.run([sys.executable, "-m", "tools.pip_to_uv", "--bogus"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "pip_to_uv.py: error: unrecognized arguments: --bogus (see --help)\n"
