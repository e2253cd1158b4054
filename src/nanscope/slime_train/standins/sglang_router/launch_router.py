"""Stand-in for sglang_router.launch_router (slime v0.3.1 and main: sglang_utils/arguments.py:4-5, whose parser calls
`RouterArgs.add_cli_args(parser, use_router_prefix=True, exclude_host_port=True)`; ray/rollout.py imports it again to
start a router). `--sglang-router-ip` is set, so no router starts (v0.3.1 ray/rollout.py:1029): no router flag has a
reader and none is defined; passing one is an error of slime's parser, which names it. v0.1.0 imports it only to
start a router (rollout.py:118), which it does not."""


class RouterArgs:
    @staticmethod
    def add_cli_args(parser, use_router_prefix: bool = False, exclude_host_port: bool = False) -> None:
        pass

    def __init__(self, *args, **kwargs):
        raise RuntimeError("nanscope's sglang_router stand-in: no router starts (--sglang-router-ip is set)")
