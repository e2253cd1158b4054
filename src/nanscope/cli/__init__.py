"""One module per subcommand; each defines `add_parser(subparsers)` and `run(args) -> int`."""
