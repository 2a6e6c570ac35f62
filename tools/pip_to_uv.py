"""Prints uv's flags for the package indexes pip is configured with, for `make setup`.

`make setup` installs the requirements with uv, in a fraction of pip's time: pip downloads,
unpacks and compiles the bytecode one file at a time, where uv installs in parallel and `make
setup` then compiles on every core (docs/measurements.md). uv does not read pip's configuration
(pip.conf, PIP_* variables), and that is where a machine says where the CPU torch comes from:
the lab machines' local wheel folder, or PyTorch's CPU index on a learner's own machine
(`PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup`). So pip's own settings
are read from `pip config list` and handed to uv as they are.

    python -m tools.pip_to_uv     # e.g. --find-links /opt/wheels --extra-index-url file:///...
"""
from __future__ import annotations

import ast
import shlex
import subprocess
import sys

from common import cli

# pip's option -> uv's (uv pip install takes the same three, one location per flag)
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links"}
# Where pip reads them, weakest first: pip.conf's [global], its [install], then PIP_* variables
# (`:env:`). The strongest one set replaces the others, lists too, as in pip.
SECTIONS = ("global", "install", ":env:")


def uv_flags(pip_config_list: str) -> list[str]:
    """The flags for the lines of `pip config list` (`section.key='value'`). A value may hold
    several locations, space-separated, as in pip."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in pip_config_list.splitlines():
        name, sep, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if sep and key in FLAGS and section in SECTIONS:
            rank = SECTIONS.index(section)
            if rank >= chosen.get(key, (-1, ""))[0]:
                chosen[key] = (rank, ast.literal_eval(value))
    return [part for key, flag in FLAGS.items() if key in chosen
            for location in chosen[key][1].split() for part in (flag, location)]


def main(argv: list[str] | None = None) -> None:
    cli.LabArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)   # takes none
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True).stdout
    print(shlex.join(uv_flags(listed)))


if __name__ == "__main__":
    main()
