"""Uneven tensor-parallel splits (Hepti §4.2-4.3): how many attention heads and MLP columns each
rank of a peer computes when its ranks differ in speed, free memory and links. What the live
peer and `hexswarm plan --hepti` call; pure (numpy and scipy's HiGHS), each module on the ones
before it.

- ``problem`` — the devices and the layer shape as plain data; the step time of a split (Eq. 5-7).
- ``lp`` — problem P2 (Eq. 9-10) as a mixed-integer LP, and its relaxation with rounding.
- ``split`` — the engine: the mode by free memory (WS, 1D- or 2D-tiled), the split record.
"""
