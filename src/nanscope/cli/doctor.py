"""`nanscope doctor` (placeholder until its issue lands)."""


def add_parser(sub):
    p = sub.add_parser("doctor", help="(not yet implemented)")
    return p


def run(args) -> int:
    print("nanscope doctor: not implemented yet")
    return 2
