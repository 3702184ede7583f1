"""The `velo` subcommands besides `serve`: `doctor`, `bench` and `chat`, one module each.

Each module offers `add_parser(subparsers)`, which registers the subcommand with `run(args) -> int` as its
`func`. They talk to servers over HTTP with aiohttp like the proxy does; a failure a user can cause (a server
that is down, an unknown model) is a `CommandError`: one line on stderr and exit status 1, never a traceback.
"""
from __future__ import annotations

import os
import sys
from typing import Callable


class CommandError(Exception):
    """A failure to report in one line (the message says what happened and, when it can, what to do)."""


def guarded(name: str, run: Callable[..., int]) -> Callable[..., int]:
    """`run` with `CommandError` turned into `velo NAME: message` and exit 1, Ctrl-C into exit 130, and a closed
    standard output into exit 1 without a traceback."""
    def wrapper(*args: object) -> int:
        try:
            return run(*args)
        except CommandError as e:
            print(f"velo {name}: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"\nvelo {name}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `velo chat | head`: the reader left, and nothing more can be said to it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit failed too
            return 1
    return wrapper
