"""Stand-in for sglang.srt.constants: the memory-region tags slime's train.py:6 imports (SGLang's own values)."""

GPU_MEMORY_TYPE_KV_CACHE = "kv_cache"
GPU_MEMORY_TYPE_WEIGHTS = "weights"
GPU_MEMORY_TYPE_CUDA_GRAPH = "cuda_graph"
