"""`nanscope scan` (placeholder until its issue lands)."""


def add_parser(sub):
    p = sub.add_parser("scan", help="(not yet implemented)")
    return p


def run(args) -> int:
    print("nanscope scan: not implemented yet")
    return 2
