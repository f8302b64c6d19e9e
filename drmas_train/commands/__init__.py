"""One module per ``drmas`` subcommand, each exposing ``main(argv) -> int``."""
