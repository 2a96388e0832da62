"""The tool subcommands of the `torchggml` command:

    torchggml perplexity MODEL -f TEXT [-c 512] [--chunks N]   (llama-perplexity)
    torchggml bench MODEL [-p 512] [-n 128] [-r 5]             (llama-bench)
    torchggml quantize IN OUT TYPE [THREADS] [--imatrix FILE]  (llama-quantize)
    torchggml imatrix MODEL -f TEXT [-o imatrix.gguf]          (llama-imatrix)
    torchggml compile-kernels [--types F16,Q4_K_M]             (the CPU kernels, ahead)
    torchggml page-in MODEL [MODEL...]                         (the file cached in 2 MiB pages)
"""
from __future__ import annotations

from .models import add_model_options, int_list, user_errors, model_params


@user_errors
def cmd_perplexity(args) -> int:
    from ..tools.perplexity import cmd_perplexity as run
    return run(args, model_params(args))


@user_errors
def cmd_bench(args) -> int:
    from ..tools.bench import cmd_bench as run
    return run(args, model_params(args))


@user_errors
def cmd_quantize(args) -> int:
    from ..tools.quantize import cmd_quantize as run
    return run(args)


@user_errors
def cmd_imatrix(args) -> int:
    from ..tools.imatrix import cmd_imatrix as run
    return run(args, model_params(args))


@user_errors
def cmd_compile_kernels(args) -> int:
    from ..tools.compile_kernels import cmd_compile_kernels as run
    return run(args)


@user_errors
def cmd_page_in(args) -> int:
    from ..gguf.loader import page_in
    for path in args.models:
        before, after = page_in(path)
        state = ("already in huge pages" if before else "now in huge pages" if after else
                 "still in 4 KiB pages (this kernel or filesystem keeps the file's cache in small folios)")
        print(f"{path}: {state}")
    return 0


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("perplexity", help="perplexity of a text as llama-perplexity computes it")
    p.add_argument("model", help="GGUF file")
    p.add_argument("-f", "--file", required=True, metavar="TEXT", help="the text file")
    p.add_argument("--chunks", type=int, default=None, metavar="N", help="score at most N windows")
    add_model_options(p)
    p.set_defaults(func=cmd_perplexity)

    p = subparsers.add_parser("bench", help="prompt and generation speed, llama-bench style")
    p.add_argument("model", help="GGUF file")
    p.add_argument("-p", "--n-prompt", type=int_list, default=[512], metavar="N[,N...]", help="prompt sizes (0: none)")
    p.add_argument("-n", "--n-gen", type=int_list, default=[128], metavar="N[,N...]", help="generation lengths (0: none)")
    p.add_argument("-r", "--repetitions", type=int, default=5, metavar="N", help="runs of each test")
    p.add_argument("--no-warmup", action="store_true", help="time the first run too")
    add_model_options(p)
    p.set_defaults(func=cmd_bench)

    from ..tools.file_types import CHOICES
    p = subparsers.add_parser("quantize", help="quantize a GGUF file with llama-quantize's types and mixes")
    p.add_argument("input", help="GGUF file (F32, F16, BF16 or quantized)")
    p.add_argument("output", help="the GGUF file to write")
    p.add_argument("type", metavar="TYPE", help=f"one of {CHOICES}")
    p.add_argument("nthreads", nargs="?", type=int, default=None, metavar="THREADS",
                   help="threads (default: all cores)")
    p.add_argument("--imatrix", metavar="FILE", help="importance matrix (llama.cpp's GGUF or .dat format)")
    p.add_argument("--include-weights", action="append", metavar="NAME",
                   help="use the imatrix only for tensors whose name contains NAME (repeatable)")
    p.add_argument("--exclude-weights", action="append", metavar="NAME",
                   help="do not use the imatrix for tensors whose name contains NAME (repeatable)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow quantizing tensors that are already quantized (loses quality)")
    p.add_argument("--output-tensor-type", metavar="TYPE", help="this ggml type for output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE", help="this ggml type for token_embd.weight")
    p.add_argument("--tensor-type", action="append", metavar="PATTERN=TYPE",
                   help="tensors whose name matches the regular expression PATTERN get TYPE (repeatable; "
                        "the first match wins)")
    p.add_argument("--pure", action="store_true", help="no mix: every quantized tensor gets the default type")
    p.add_argument("--leave-output-tensor", action="store_true", help="leave output.weight as it is")
    p.add_argument("--dry-run", action="store_true",
                   help="print each tensor's planned type and the resulting size; write nothing")
    p.add_argument("--keep-split", action="store_true",
                   help="write the output split as the input is (OUTPUT-00001-of-0000N.gguf, ...; OUTPUT's .gguf "
                        "dropped)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every tensor's old and new type")
    p.set_defaults(func=cmd_quantize)

    p = subparsers.add_parser("imatrix", help="collect an importance matrix over a text, as llama-imatrix does")
    p.add_argument("model", help="GGUF file")
    p.add_argument("-f", "--file", required=True, metavar="TEXT", help="the text file")
    p.add_argument("-o", "--output", default="imatrix.gguf", metavar="FILE", help="the imatrix to write (GGUF)")
    p.add_argument("--chunks", type=int, default=None, metavar="N", help="process at most N chunks")
    p.add_argument("--process-output", action="store_true", help="collect output.weight's activations too")
    add_model_options(p)
    p.set_defaults(func=cmd_imatrix)

    p = subparsers.add_parser("compile-kernels", help="compile the CPU's numba kernels now (after an install) "
                                                      "instead of during the first prompt")
    from ..tools.compile_kernels import FILE_TYPES as COMPILED
    p.add_argument("--types", metavar="TYPE[,TYPE...]", help=f"model file types (default: {','.join(COMPILED)})")
    p.set_defaults(func=cmd_compile_kernels)

    p = subparsers.add_parser("page-in", help="re-read model files into the page cache in 2 MiB folios, so that "
                                              "their mappings use huge pages (faster CPU decode)")
    p.add_argument("models", nargs="+", metavar="MODEL", help="GGUF files")
    p.set_defaults(func=cmd_page_in)
