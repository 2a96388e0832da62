"""The CPU's numba kernels; loader.py loads them."""
