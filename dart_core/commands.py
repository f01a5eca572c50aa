"""Subcommands besides `generate`. Each module adds its parser here and sets `handler`."""


def register(sub) -> None:
    from . import bench, ngram_build, train_cli

    ngram_build.register(sub)
    bench.register(sub)
    train_cli.register(sub)
