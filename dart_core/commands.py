"""Subcommands besides `generate`. Each module adds its parser here and sets `handler`."""


def register(sub) -> None:
    pass
