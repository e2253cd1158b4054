"""Layer 1, facts: what slime, megatron-core and fp32 are, as data. Torch-free, and no file is read.

    releases.py  the slime releases nanscope knows and what differs between them (doctor, scan, the plugin's
                 loss API per release)
    flags.py     the one table of modelled flags: defaults, choices and the release each exists from
    args.py      the namespace of the fields slime's loss path reads, with their defaults
    keys.py      the names of slime's batch keys, each tuple once
    numerics.py  fp32's limits and the guard's clamp bound
    megatron.py  megatron-core's messages and the version labels evidence cites
    paths.py     the dotted paths a slime launch script names nanscope's plugin by

Every module above this layer asks here; nothing here imports anything of nanscope but `errors`.
"""
