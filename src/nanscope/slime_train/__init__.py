"""slime's own train.py on CPU: the case's run, through slime's own code, on a laptop (`nanscope repro --slime-src`).

    run.py        the run end to end: work dir, prepare, the Ray head and its train.py launches, the results
    flags.py      the case's launch flags kept, resized, dropped (CPU-impossible) or added, each with why
    prepare.py    the --ref-load torch_dist checkpoint and the rollout with the hazard, from one model (a subprocess)
    head.py       a local Ray instance with 4 logical GPUs and each launch's train.py on it (a subprocess)
    worker.py     Ray's worker_process_setup_hook: the CPU layer (`nanscope.megatron.cpu.install_slime`) in every worker
    spec.py       the layer spec slime's provider builds (local layers, CPU variable-length attention)
    hf.py         the tiny Qwen3-MoE's Hugging Face dir: config.json and a tokenizer, written locally
    standins/     sglang, torch_memory_saver and triton stand-ins, and the driver's sitecustomize (not a package)

docs/slime-train.md says what is patched, stood in and dropped, and why.
"""
