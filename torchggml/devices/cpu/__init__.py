"""The CPU device: numba kernels on ggml's blocks beside torch's, quantized weights in CPU_REPACK
layouts; what runs an op on the CPU is kernels.py's table.

    cpu.py         CPUDevice, CPUBackend, CPUReg and the C API's CPU functions
    kernels.py     CPU_KERNELS: each op's layers in order (numba, weight layout, torch reference)
    fast_ops.py    the numba layer for decode's small nodes
    products.py    the CPU's matrix products: a weight's layout product, torch's half GEMM
    layouts/       the CPU_REPACK extra buffer types, one per weight layout (base.py: the shared
                   buffer type and checks; fused.py: (q, scale, bias) for the numba kernels, over
                   decompose.py; int4.py: torch's int4 GEMM layout)
    jit/           the numba kernels under one loader (loader.py): quant_kernels.py (fused
                   products), op_kernels.py (small nodes), llvm_ir.py (their vector code)
    features.py    this CPU's features, and the product path they choose
"""
from .cpu import (REG_ORDER, CPUBackend, CPUDevice, CPUReg, Threadpool, backend_cpu_buffer_from_ptr,
                     backend_cpu_buffer_type, backend_cpu_init, backend_cpu_set_n_threads,
                     backend_cpu_set_threadpool, backend_cpu_set_use_ref, backend_is_cpu, backend_reg,
                     cpu_buffer_type, cpu_device, cpu_reg, host_memory, repack_buffer_type, threadpool_free,
                     threadpool_get_n_threads, threadpool_new, threadpool_pause, threadpool_resume)
from .kernels import CPU_KERNELS

__all__ = ["REG_ORDER", "CPUBackend", "CPUDevice", "CPUReg", "CPU_KERNELS", "Threadpool",
           "backend_cpu_buffer_from_ptr", "backend_cpu_buffer_type", "backend_cpu_init",
           "backend_cpu_set_n_threads", "backend_cpu_set_threadpool", "backend_cpu_set_use_ref", "backend_is_cpu",
           "backend_reg", "cpu_buffer_type", "cpu_device", "cpu_reg", "host_memory", "repack_buffer_type",
           "threadpool_free", "threadpool_get_n_threads", "threadpool_new", "threadpool_pause", "threadpool_resume"]
