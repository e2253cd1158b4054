"""`nanscope trace` (placeholder until its issue lands)."""


def add_parser(sub):
    p = sub.add_parser("trace", help="(not yet implemented)")
    return p


def run(args) -> int:
    print("nanscope trace: not implemented yet")
    return 2
