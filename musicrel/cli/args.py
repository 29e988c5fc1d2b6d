"""The `musicrel` subcommands, one module each (registered by musicrel.cli)."""

from __future__ import annotations


def given(args, *names: str) -> dict:
    """The options among `names` that were given (not None): those left out are not passed, so their defaults
    stay in the function called."""
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}
