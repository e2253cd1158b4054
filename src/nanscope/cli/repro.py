"""`nanscope repro` (placeholder until its issue lands)."""


def add_parser(sub):
    p = sub.add_parser("repro", help="(not yet implemented)")
    return p


def run(args) -> int:
    print("nanscope repro: not implemented yet")
    return 2
