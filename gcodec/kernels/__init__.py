"""Hot loops, one per backend. ``cpu`` modules hold fused Numba kernels compiled with cache=True.

Every kernel works on flat, C-contiguous arrays and is the only place a codec's inner loop lives.
Kernels whose name ends in ``_par`` split the work into fixed-size chunks over ``numba.prange``;
their result does not depend on the number of threads.
"""
