"""Lets hivemind 1.1.10 import under torch >= 2.3; on PYTHONPATH for the Petals venv's processes only.

hivemind/optim/grad_scaler.py imports `_refresh_per_optimizer_state` from `torch.cuda.amp.grad_scaler`,
where torch kept it until 2.3; it now lives in `torch.amp.grad_scaler`.
"""

try:
    import torch.amp.grad_scaler as _amp
    import torch.cuda.amp.grad_scaler as _cuda
except ImportError:  # an interpreter without torch: nothing to patch
    pass
else:
    if not hasattr(_cuda, "_refresh_per_optimizer_state"):
        _cuda._refresh_per_optimizer_state = _amp._refresh_per_optimizer_state
