import os

# Tests run on CPU with torch's default threads; keep them from oversubscribing 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
