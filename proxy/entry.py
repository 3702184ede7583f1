"""The `velo` command itself, kept apart from proxy/cli.py so that its first import is nothing: Velo's own imports
take 1.4 s (aiohttp, tokenizers, the dialects), and a Ctrl-C among them was a KeyboardInterrupt traceback."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from .cli import main as velo
    except KeyboardInterrupt:  # as cli.main says it for one while Velo starts; logging is not set up yet
        sys.stderr.write("velo: stopped while starting: not listening\n")
        return 130
    return velo(argv)
