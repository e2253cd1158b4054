"""Layer 1, the causes as data: the classes of cause, the hazard catalogue, and the causes slime is immune to.

    classes.py    the five classes a non-finite step is sorted into (data, loss numerics, model forward,
                  model backward, optimizer)
    catalogue.py  the hazards nanscope builds, plants and runs: mechanism, flags, class, fix, discriminator
    immune.py     causes real runs hit that slime's own code rules out, with the lines that show it

Torch-free and no file reads; `nanscope.hazards` builds the batches, `nanscope.trace.sentinels.classify` sorts a
reading.
"""
