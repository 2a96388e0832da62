"""Every public name of `torchggml`, imported at once (torch and the whole package).

torchggml/__init__.py imports this module on the first access to one of its names, so that
`torchggml --version`, `--help` and the command line's parsing import neither torch nor the
rest: see torchggml/__init__.py.
"""
# OpenMP's wait policy is left to the user (OMP_WAIT_POLICY, GOMP_SPINCOUNT), as torch and
# llama.cpp leave it: the default (workers spin a while between parallel regions, then sleep)
# is faster for decode and prompts on a machine the model has to itself; on a machine shared
# with other busy processes, OMP_WAIT_POLICY=PASSIVE avoids spinning workers holding the cores
# (there spinning made decode many times slower). See docs/cpu.md, "Threads".

# ---------------------------------------------------------------- types and enums (ggml.h)
from .types import (Type, TypeTraits, type_traits, type_name, type_size, blck_size, row_size,
                    is_quantized, type_to_dtype, dtype_to_type)
from .enums import Op, UnaryOp, GluOp, SortOrder, TensorFlag, Status, RopeType, Prec
from .enums import OpPool, ScaleMode, ScaleFlag, TriType

# ---------------------------------------------------------------- tensors
from .tensor import (Tensor, nelements, nrows, nbytes, element_size, n_dims, is_contiguous,
                     is_contiguous_rows, is_contiguous_n, is_contiguous_1, is_contiguous_2, is_contiguous_channels,
                     is_padded_1d, is_transposed, is_permuted, is_empty, is_scalar, is_vector,
                     is_matrix, are_same_shape, are_same_stride, are_same_layout, can_repeat,
                     set_name, get_name, format_name, set_input, set_output, set_param, set_loss,
                     get_op_params_i32, get_op_params_f32, set_op_params_i32, set_op_params_f32,
                     get_unary_op, get_glu_op)

# ---------------------------------------------------------------- contexts
from .context import (Context, init, free, get_no_alloc, set_no_alloc, get_first_tensor,
                      get_next_tensor, get_tensor, used_mem, new_tensor, new_tensor_1d,
                      new_tensor_2d, new_tensor_3d, new_tensor_4d, new_i32, new_f32, dup_tensor,
                      view_tensor)

# ---------------------------------------------------------------- graphs
from .graph import (CGraph, new_graph, new_graph_custom, graph_size, graph_n_nodes, graph_node,
                    graph_nodes, graph_add_node, build_forward_expand, build_forward_select,
                    graph_view, graph_cpy, graph_dup, graph_clear, graph_get_tensor)
from .backward import build_backward_expand, graph_get_grad, graph_get_grad_acc, graph_reset

# ---------------------------------------------------------------- graph-building ops
from .ops import *  # noqa: F401,F403  (every op function; ops.__all__)
from . import ops as _ops

# ---------------------------------------------------------------- torch interop
from .interop import to_torch, from_torch

# ---------------------------------------------------------------- buffer types and buffers (ggml-backend.h)
from .backend.buffer import (BufferType, Buffer, BufferUsage, backend_buft_name,
                             backend_buft_alloc_buffer, backend_buft_get_alignment,
                             backend_buft_get_max_size, backend_buft_get_alloc_size,
                             backend_buft_is_host, backend_buft_get_device, backend_buffer_name,
                             backend_buffer_free, backend_buffer_get_base, backend_buffer_get_size,
                             backend_buffer_init_tensor, backend_buffer_get_alignment,
                             backend_buffer_get_max_size, backend_buffer_get_alloc_size,
                             backend_buffer_clear, backend_buffer_is_host, backend_buffer_set_usage,
                             backend_buffer_get_usage, backend_buffer_get_type, backend_buffer_reset)
from .backend.multi_buffer import (MultiBuffer, backend_multi_buffer_alloc_buffer,
                                   backend_buffer_is_multi_buffer, backend_multi_buffer_set_usage)
from .backend.tensor_io import (backend_tensor_set, backend_tensor_get, backend_tensor_memset,
                                backend_tensor_copy)
from .backend.tensor_io_2d import (backend_tensor_set_2d, backend_tensor_get_2d, backend_tensor_set_2d_async,
                                   backend_tensor_get_2d_async)

# ---------------------------------------------------------------- backends
from .backend.backend import (Backend, backend_guid, backend_name, backend_free,
                              backend_get_default_buffer_type, backend_alloc_buffer,
                              backend_get_alignment, backend_get_max_size, backend_get_device,
                              backend_tensor_set_async, backend_tensor_get_async,
                              backend_tensor_copy_async, backend_synchronize,
                              backend_graph_plan_create, backend_graph_plan_free,
                              backend_graph_plan_update, backend_graph_plan_compute,
                              backend_graph_compute, backend_graph_compute_async,
                              backend_supports_op, backend_supports_buft, backend_offload_op)

# ---------------------------------------------------------------- events
from .backend.event import (backend_event_new, backend_event_free, backend_event_record,
                            backend_event_synchronize, backend_event_wait)

# ---------------------------------------------------------------- devices and regs
from .backend.device import DeviceType, DeviceCaps, DeviceProps, Device, Reg, Event
from .backend.device import (backend_dev_name, backend_dev_description, backend_dev_memory,
                             backend_dev_type, backend_dev_get_props, backend_dev_backend_reg,
                             backend_dev_init, backend_dev_buffer_type, backend_dev_host_buffer_type,
                             backend_dev_buffer_from_host_ptr, backend_dev_supports_op,
                             backend_dev_supports_buft, backend_dev_offload_op, backend_reg_name,
                             backend_reg_dev_count, backend_reg_dev_get, backend_reg_get_proc_address)

# ---------------------------------------------------------------- the registry
from .backend.registry import (backend_register, backend_device_register, backend_reg_count,
                               backend_reg_get, backend_reg_by_name, backend_dev_count,
                               backend_dev_get, backend_dev_by_name, backend_dev_by_type,
                               backend_dev_for_torch_device, backend_init_by_name,
                               backend_init_by_type, backend_init_best, backend_load,
                               backend_unload, backend_load_all, backend_load_all_from_path)

# ---------------------------------------------------------------- the scheduler
from .backend.sched import (Sched, backend_sched_new, backend_sched_free, backend_sched_reserve,
                            backend_sched_reserve_size, backend_sched_get_n_backends,
                            backend_sched_get_backend, backend_sched_get_n_splits,
                            backend_sched_get_n_copies, backend_sched_get_buffer_type,
                            backend_sched_get_buffer_size, backend_sched_set_tensor_backend,
                            backend_sched_get_tensor_backend, backend_sched_split_graph,
                            backend_sched_alloc_graph, backend_sched_graph_compute,
                            backend_sched_graph_compute_async, backend_sched_synchronize,
                            backend_sched_reset, backend_sched_set_eval_callback)
from .backend.sched_dot import backend_sched_graph_dump_dot

# ---------------------------------------------------------------- the meta device (tensor parallel) and collectives
from .devices.meta.split import SplitAxis, MetaSplitState, backend_meta_split_axis_name, UnsupportedSplitError
from .devices.meta.meta import (backend_meta_device, backend_dev_is_meta,
                           get_split_state as backend_meta_get_split_state, backend_is_meta,
                           backend_buffer_is_meta, backend_buft_is_meta, backend_meta_n_backends,
                           backend_meta_simple_backend)
from .backend.comm import comm_init, comm_allreduce_tensor, comm_free

# ---------------------------------------------------------------- utils
from .backend.utils import (GraphCopy, backend_graph_copy, backend_graph_copy_free,
                            backend_compare_graph_backend)

# ---------------------------------------------------------------- allocators (ggml-alloc.h)
from .alloc import (backend_tensor_alloc, backend_view_init, backend_alloc_ctx_tensors,
                    backend_alloc_ctx_tensors_from_buft, backend_alloc_ctx_tensors_from_buft_size,
                    Tallocr, tallocr_new, tallocr_alloc, Gallocr, gallocr_new, gallocr_new_n,
                    gallocr_free, gallocr_reserve, gallocr_reserve_n, gallocr_reserve_n_size,
                    gallocr_alloc_graph, gallocr_get_buffer_size, op_can_inplace)

# ---------------------------------------------------------------- the CPU (ggml-cpu.h) and other devices
from .devices.cpu import (backend_cpu_init, backend_cpu_buffer_type, backend_cpu_buffer_from_ptr,
                                backend_cpu_set_n_threads, backend_is_cpu, backend_cpu_set_threadpool,
                                backend_cpu_set_use_ref, threadpool_new, threadpool_free,
                                threadpool_get_n_threads, threadpool_pause, threadpool_resume)
from .devices.cuda import backend_cuda_init
from .devices.sim import backend_sim_init

# ---------------------------------------------------------------- kernels from user code
from .devices.kernels.registered import (register_kernel, registered_kernels, load_kernel_files,
                                               KernelRegistration)

# ---------------------------------------------------------------- remote devices (ggml-rpc.h)
from .devices.rpc import (backend_rpc_init, backend_is_rpc, backend_rpc_buffer_type, backend_rpc_get_device_memory,
                  backend_rpc_start_server, backend_rpc_reg, backend_rpc_add_server, RPCServer,
                  RPCServerGoneError)

# ---------------------------------------------------------------- errors
from .storage import UnallocatedTensorError
from .devices.kernels import UnsupportedOpError
from .devices.stream import StreamError

# ---------------------------------------------------------------- reference quantization, models
from . import quants  # ggml.quants.quantize / dequantize
from .models import load_model, Model
from .mtmd import load_multimodal, Multimodal  # a text model with an mmproj: images in prompts

# ---------------------------------------------------------------- PyTorch integration
from .torch_integration import graph_function, GraphFunction
from .profiler import PROFILE_ENV

__all__ = [name for name, value in globals().items()
           if not name.startswith("_") and (not isinstance(value, type(_ops)) or name == "quants")]
