"""Stand-in for sglang.srt.entrypoints.http_server (sglang_engine.py:11): no SGLang server starts."""


def launch_server(*args, **kwargs):
    raise RuntimeError("nanscope's SGLang stand-in: no SGLang server starts under --debug-train-only")
