"""Stand-in for sglang.srt.server_args: `ServerArgs.add_cli_args`, which slime's parser calls
(sglang_utils/arguments.py:108) under its `--sglang-` prefix.

Only the server flags slime itself reads are defined, with SGLang's defaults (validate_args, arguments.py:114-125;
the converters' `sglang_enable_ep_moe`). No SGLang engine starts under --debug-train-only, so no other server
flag has a reader; passing one is an error of slime's parser, which names it.
"""


class ServerArgs:
    """The flags of SGLang's server that slime reads; a --debug-train-only run starts no server."""

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--data-parallel-size", "--dp-size", type=int, default=1)
        parser.add_argument("--pipeline-parallel-size", "--pp-size", type=int, default=1)
        parser.add_argument("--expert-parallel-size", "--ep-size", type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true")
        parser.add_argument("--enable-ep-moe", action="store_true")

    def __init__(self, *args, **kwargs):
        raise RuntimeError("nanscope's SGLang stand-in: no SGLang server starts under --debug-train-only")
