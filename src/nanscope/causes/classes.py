"""The classes of cause a non-finite step is sorted into (`nanscope.trace.sentinels.classify` decides which).

data            non-finite log-probs, rewards or advantages reach the loss
loss-numerics   the loss's own ops (an exp that overflows before its clamp) make a finite input non-finite
model-forward   the first non-finite output in forward order is inside the model
model-backward  a module's backward makes a non-finite gradient from finite inputs
optimizer       parameters are non-finite although the gradients were finite
hardware        a device made it once: the step's rerun is clean (or non-finite elsewhere); no single reading
                tells it, the plugin's rerun verdict does (NANSCOPE_RERUN)
"""

from __future__ import annotations

DATA = "data"
LOSS_NUMERICS = "loss-numerics"
MODEL_FORWARD = "model-forward"
MODEL_BACKWARD = "model-backward"
OPTIMIZER = "optimizer"
HARDWARE = "hardware"
CLASSES = (DATA, LOSS_NUMERICS, MODEL_FORWARD, MODEL_BACKWARD, OPTIMIZER, HARDWARE)
