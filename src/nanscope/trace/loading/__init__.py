"""A user's torch.save file read with torch.load(weights_only=True), within bounds: micro-batch files, repro
bundles, and (the budget) the restricted unpickler of `nanscope.dumps`.

Modules (the package imports none of them, so the torch-free ones load without torch):
    torch_file     every torch.load(weights_only=True) of a user's file, bounded by what was read
    pickle_budget  what a pickle may build: 8 bytes a byte of its file + 32 MiB (torch-free)
"""
