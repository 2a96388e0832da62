"""Fused quantized products for the CPU device (issue 9): path selection by CPU features
(features.py), every block type as (q, scale, bias) (decompose.py), numba kernels (kernels.py)
and the repack buffer type that stores and multiplies them (layout.py)."""
