"""Command line of the demo model: ``python -m demo_model serve|write-home`` (``--help`` lists options)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from demo_model.codex_home import DEFAULT_CONTEXT_WINDOW, ENV_KEY, write_codex_home
from demo_model.server import serve
from demo_model.usage import DEFAULT_BASE_TOKENS, DEFAULT_OUTPUT_TOKENS, DEFAULT_TURN_TOKENS, UsageModel


def build_parser() -> argparse.ArgumentParser:
    """The ``serve`` and ``write-home`` sub-commands and their options."""
    parser = argparse.ArgumentParser(
        prog="python -m demo_model",
        description="Boss's built-in demo model (not a real model) for the real Codex CLI, offline.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve the Responses API stand-in in the foreground")
    serve_parser.add_argument("--host", default="127.0.0.1")
    serve_parser.add_argument("--port", type=int, default=8123)
    serve_parser.add_argument(
        "--base-tokens", type=int, default=DEFAULT_BASE_TOKENS, help="input tokens with no user turn"
    )
    serve_parser.add_argument(
        "--turn-tokens", type=int, default=DEFAULT_TURN_TOKENS, help="input tokens added per user turn"
    )
    serve_parser.add_argument(
        "--output-tokens", type=int, default=DEFAULT_OUTPUT_TOKENS, help="output tokens per response"
    )
    home_parser = commands.add_parser("write-home", help="write a Codex home config.toml for the demo model")
    home_parser.add_argument("--codex-home", type=Path, required=True)
    home_parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8123/v1")
    home_parser.add_argument("--context-window", type=int, default=DEFAULT_CONTEXT_WINDOW)
    home_parser.add_argument("--auto-compact-token-limit", type=int, default=None)
    home_parser.add_argument("--env-key", default=ENV_KEY)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one sub-command; returns the exit code (2 for bad options, with the reason on stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            usage_model = UsageModel(args.base_tokens, args.turn_tokens, args.output_tokens)
            serve(args.host, args.port, usage_model)
            return 0
        path = write_codex_home(
            args.codex_home,
            args.base_url,
            context_window=args.context_window,
            auto_compact_token_limit=args.auto_compact_token_limit,
            env_key=args.env_key,
        )
    except ValueError as error:
        parser.error(str(error))
    sys.stdout.write(f"wrote {path}; run Codex with {args.env_key} set to any value\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
