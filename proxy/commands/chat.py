"""`velo chat [MODEL]`: a terminal chat through Velo, for a first check after install.

Answers stream as they come; the conversation is kept and sent whole each turn (`/clear` forgets it).
Lines are read with `input()` between turns while no event loop runs, so GNU readline (line editing, arrow-key
history) works and nothing blocks the loop; one `asyncio.Runner` keeps the loop and its HTTP session across
turns. Ctrl-C while an answer streams stops that answer (the server cancels its work when the stream closes);
at the prompt it leaves. With piped input nothing is echoed and any error ends the run with status 1.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

from . import CommandError, guarded
from .client import (add_connection_args, chat_stream, check_model, list_models, ollama_chat_stream, open_session,
                     speaks_ollama)

HELP = """commands:
  /model         show the current model and the ones the server lists
  /model NAME    switch to NAME (the conversation so far is kept)
  /clear         forget the conversation
  /exit          leave (also /bye, Ctrl-D)"""


@dataclass
class Conversation:
    base: str
    model: str
    system: str | None = None
    ollama: bool = True  # the server speaks Ollama's API: chat as `ollama run` does (see client.py)
    history: list[dict[str, Any]] = field(default_factory=list)

    def messages(self, user_text: str) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.history, {"role": "user", "content": user_text}]


async def answer(session: aiohttp.ClientSession, chat: Conversation, user_text: str) -> None:
    """Streams the reply to stdout; the turn joins the history only once the answer is complete."""
    pieces: list[str] = []
    stream = ollama_chat_stream if chat.ollama else chat_stream
    try:
        async with stream(session, chat.base, chat.model, chat.messages(user_text)) as reply:
            async for text in reply.texts():
                pieces.append(text)
                sys.stdout.write(text)
                sys.stdout.flush()
    except BaseException:  # the partial answer's line ends: an error was written at the end of its text
        if pieces:
            sys.stdout.write("\n")
        raise
    sys.stdout.write("\n")
    chat.history += [{"role": "user", "content": user_text}, {"role": "assistant", "content": "".join(pieces)}]


async def switch_model(session: aiohttp.ClientSession, chat: Conversation, name: str) -> str:
    if not name:
        names = await list_models(session, chat.base)
        return f"model: {chat.model}\navailable: {', '.join(names) or 'none listed'}"
    chat.model = await check_model(session, chat.base, name)
    return f"(now talking to {chat.model})"


def read_line(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


def enable_line_editing() -> None:
    try:
        import readline  # noqa: F401 - importing it is what turns editing on for input()
    except ImportError:  # Windows without pyreadline: plain input() still works
        pass


def run_line(runner: asyncio.Runner, session: aiohttp.ClientSession, chat: Conversation, line: str,
             say: Callable[[str], None]) -> bool:
    """One line typed: a command or a message. False when it asks to leave."""
    command, _, argument = line.partition(" ")
    if command in ("/exit", "/bye", "/quit"):
        return False
    if command == "/help":
        say(HELP)
    elif command == "/clear":
        chat.history.clear()
        say("(conversation cleared)")
    elif command == "/model":
        say(runner.run(switch_model(session, chat, argument.strip())))
    elif command.startswith("/"):
        say(f"unknown command {command}; /help lists them")
    else:
        runner.run(answer(session, chat, line))
    return True


def chat_loop(runner: asyncio.Runner, session: aiohttp.ClientSession, chat: Conversation, interactive: bool) -> None:
    say: Callable[[str], None] = print if interactive else (lambda _: None)
    say(f"talking to {chat.model} at {chat.base}; /help lists the commands")
    while (line := read_line(f"{chat.model}> " if interactive else "")) is not None:
        try:
            if line.strip() and not run_line(runner, session, chat, line.strip(), say):
                break
        except CommandError as e:
            if not interactive:
                raise
            print(f"velo chat: {e}", file=sys.stderr)
        except KeyboardInterrupt:  # Ctrl-C while streaming: the runner cancelled the answer
            if not interactive:  # a script's run ends there, with 130 (its output had "(stopped)" in it)
                raise
            print("(stopped)")


def run(args: argparse.Namespace) -> int:
    interactive = sys.stdin.isatty()
    if interactive:
        enable_line_editing()
    base = args.url.rstrip("/")
    with asyncio.Runner() as runner:
        session = runner.run(_open(args.api_key))
        try:
            model = runner.run(check_model(session, base, args.model))
            ollama = runner.run(speaks_ollama(session, base))
            try:
                chat_loop(runner, session, Conversation(base, model, args.system, ollama=ollama), interactive)
            except KeyboardInterrupt:  # at the prompt: leave quietly (before it, or piped, it is exit 130)
                if not interactive:
                    raise
                print()
        finally:
            runner.run(session.close())
    return 0


async def _open(api_key: str | None) -> aiohttp.ClientSession:
    return open_session(api_key)  # made inside the loop that will use it


def add_parser(sub: Any) -> None:
    p = sub.add_parser("chat", help="chat with a model through Velo in the terminal",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="model name (default: the first one the server lists)")
    add_connection_args(p)
    p.add_argument("--system", help="a system prompt for the whole conversation")
    p.set_defaults(func=guarded("chat", run))
