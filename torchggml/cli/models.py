"""The model subcommands of the `torchggml` command: run, eval, info.

    torchggml run [MODEL] -p PROMPT -n N [--chat] [--device DEV[,DEV...]] [--n-gpu-layers N]
    torchggml run MODEL --mmproj MMPROJ --image X.jpg -p "Describe <__media__>"
    torchggml eval MODEL --tokens 1,2,3 [--chunks 48,1,1] --out logits.npy
    torchggml info MODEL

`add_subcommands(subparsers)` adds them to an argparse subparsers object; each sets `func`.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time


def user_errors(fn):
    """Bad files, options and vocabularies end the command with one clear line, not a traceback."""
    @functools.wraps(fn)
    def run(args) -> int:
        from ..gguf.loader import GGUFError
        from ..text.tokenizer import TokenizerError
        try:
            return fn(args)
        except (GGUFError, TokenizerError, FileNotFoundError, ValueError, MemoryError, ConnectionError) as e:
            print(f"torchggml {args.command}: error: {e}", file=sys.stderr)
            return 1
    return run


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace("/", ",").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--device", metavar="DEV[,DEV...]",
                   help="devices for the layers, e.g. CPU, CUDA0, SIM0,SIM1 (see `torchggml devices`)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, metavar="N",
                   help="offload the last N layers to the accelerators (llama.cpp's -ngl)")
    p.add_argument("-ts", "--tensor-split", type=_float_list, metavar="A,B,...",
                   help="share of the layers for each device, e.g. 3,1")
    p.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                   help="KV cache size in tokens (default: the model's context length, at most 4096)")
    p.add_argument("-b", "--batch-size", type=int, default=512, metavar="N", help="prompt micro-batch size")
    p.add_argument("-fa", "--flash-attn", action="store_true", help="use flash_attn_ext for attention")
    p.add_argument("-ctk", "--cache-type", default="f16", metavar="TYPE",
                   help="KV cache type: f16 (default), f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; "
                        "q2_k..q6_k, iq4_xs for head sizes that are multiples of 256 (quantized needs -fa)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads")
    p.add_argument("-tp", "--tensor-parallel", metavar="DEV,DEV,...|dist",
                   help="split every layer over these devices (a meta device), e.g. SIM0,SIM1; "
                        "'dist': one device per torchrun rank (torch.distributed, gloo on CPU)")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT...]",
                   help="add the devices of ggml RPC servers (torchggml rpc-server, llama.cpp's rpc-server); "
                        "without -d/-ngl the layers are split over them and the local CPU")
    p.add_argument("--no-repack", dest="repack", action="store_false",
                   help="keep CPU weights in ggml's layout (no CPU_REPACK buffers)")
    p.add_argument("--no-mmap", dest="use_mmap", action="store_false",
                   help="read CPU weights into memory (huge pages) instead of mapping the file: "
                        "faster decode, slower load")
    add_kernels_option(p)


def add_kernels_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernels", action="append", default=[], metavar="FILE.py|MODULE",
                   help="first import this Python file or module, which registers kernels with "
                        "torchggml.register_kernel (repeatable)")


def add_chat_template_option(p: argparse.ArgumentParser) -> None:
    from ..text.chat import BUILTIN_TEMPLATES
    p.add_argument("--chat-template", metavar="NAME|JINJA", default=None,
                   help=f"chat format: {', '.join(BUILTIN_TEMPLATES)} or a Jinja template (default: the file's "
                        f"tokenizer.chat_template, else chatml as llama.cpp)")


def use_chat_template(model, args) -> None:
    """Set the model's chat format from --chat-template and say on stderr which one is used
    when it is not the file's own."""
    model.chat_template_override = getattr(args, "chat_template", None)
    chosen = model.chat_template()
    if chosen.note:
        print(f"torchggml {args.command}: {chosen.note}", file=sys.stderr)


def model_params(args) -> "ModelParams":
    """The ModelParams the model options of `add_model_options` give."""
    from ..models.params import ModelParams
    return ModelParams(devices=args.device.split(",") if args.device else None, n_gpu_layers=args.n_gpu_layers,
                       tensor_split=args.tensor_split, n_ctx=args.ctx_size, n_batch=args.batch_size,
                       flash_attn=args.flash_attn, kv_type=args.cache_type, n_threads=args.threads,
                       repack=getattr(args, "repack", True), use_mmap=getattr(args, "use_mmap", True),
                       tensor_parallel=getattr(args, "tensor_parallel", None),
                       rpc=args.rpc.split(",") if getattr(args, "rpc", None) else None)


def _main_rank() -> bool:
    """False on the other ranks of a torch.distributed run (rank 0 prints and writes)."""
    import torch.distributed as dist
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _load(args, path: str, prompt_tokens=None, **options):
    """The model, loaded and (unless --no-warmup) warmed up as llama.cpp does: its kernels
    compiled, its backends set up, so that the first prompt's time is its own.
    prompt_tokens(model): the length of the prompt that comes next, to warm up with (warm_up)."""
    from ..models import load_model
    from ..models.warmup import warm_up
    from ..devices.kernels.registered import load_kernel_files
    load_kernel_files(getattr(args, "kernels", None) or [])
    start = time.perf_counter()
    model = load_model(path, model_params(args).with_options(**options))
    model.timings.load_s = time.perf_counter() - start
    if getattr(args, "warmup", True):
        model.timings.warmup_s = warm_up(model, prompt_tokens(model) if prompt_tokens else None)
    return model


def perf_text(t) -> str:
    """The timings as llama.cpp's llama_perf_context_print gives them: load (the warm-up within
    it), prompt eval, eval (the generated tokens), total."""
    def rate(n, s, unit):
        return (f"{n:5d} {unit} in {s * 1e3:10.2f} ms ({s * 1e3 / n:8.2f} ms per token, {n / s:8.2f} tokens per second)"
                if n and s else f"{n:5d} {unit}")
    return "\n".join([
        f"load time        = {(t.load_s + t.warmup_s) * 1e3:10.2f} ms (warm-up {t.warmup_s * 1e3:.2f} ms: kernels "
        f"compiled or loaded, backends set up)",
        f"prompt eval time = {rate(t.prompt_tokens, t.prompt_s, 'tokens')}",
        f"eval time        = {rate(t.gen_tokens, t.gen_s, 'runs  ')}",
        f"total time       = {(t.load_s + t.warmup_s + t.prompt_s + t.gen_s) * 1e3:10.2f} ms"])


def add_warmup_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up run after loading (then the first prompt's time holds the kernels' "
                        "compiling or loading and the backends' set-up)")


# ---------------------------------------------------------------- run

@user_errors
def cmd_run(args) -> int:
    path = args.model
    if path is None:
        from ..gguf.writer.demo import demo_model_path
        path = demo_model_path()
        print(f"no model given: using the built-in demo model {path}\n"
              f"(random weights and a tiny vocabulary: the text is gibberish)", file=sys.stderr)
    plain = args.logprobs is None and not (args.image or args.mmproj or args.chat)
    model = _load(args, path, (lambda m: len(m.tokenize(args.prompt))) if plain else None)
    print(model.describe(), file=sys.stderr)
    import io
    sampling = dict(max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                    repeat_last_n=args.repeat_last_n, frequency_penalty=args.frequency_penalty,
                    presence_penalty=args.presence_penalty, stop=args.stop or ())
    out = sys.stdout if _main_rank() else io.StringIO()  # the other ranks generate the same text
    if args.logprobs is not None:
        return _run_logprobs(model, args, sampling, out)
    if args.image or args.mmproj:
        return _run_media(model, args, sampling, out)
    if args.chat:  # the prompt is a user message, formatted by the model's chat template
        use_chat_template(model, args)
        stream = model.chat([{"role": "user", "content": args.prompt}], **sampling)
    else:
        stream = model.generate(model.tokenize(args.prompt), **sampling)
        out.write(args.prompt)
        out.flush()
    for text in stream:
        out.write(text)
        out.flush()
    out.write("\n")
    print(perf_text(model.timings), file=sys.stderr)
    model.close()
    return 0


def _run_media(model, args, sampling, out) -> int:
    """run --mmproj F --image X: the prompt's <__media__> markers (none: the images first) replaced
    by the images, encoded by the projector on the model's input device."""
    if not (args.image and args.mmproj):
        raise ValueError("--image needs --mmproj (the model's multimodal projector), and --mmproj an --image")
    from ..mtmd import Multimodal, load_mmproj, media_prompt
    mm = Multimodal(model, load_mmproj(args.mmproj, model.placement.input))
    text = args.prompt
    if args.chat:  # the template's own BOS text is dropped: the first part gets BOS as a token
        text = model.chat_prompt([{"role": "user", "content": text}])
        tok = model.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        text = text[len(bos):] if bos and text.startswith(bos) else text
    for piece in mm.generate(media_prompt(text, args.image), **sampling):
        out.write(piece)
        out.flush()
    out.write("\n")
    mm.close()
    return 0


def _run_logprobs(model, args, sampling, out) -> int:
    """run --logprobs N: one line per generated token: its text, log-probability and the N most
    likely tokens' (Model.generate_tokens)."""
    from ..models.sampling import SamplingParams
    max_tokens, stop = sampling.pop("max_tokens"), sampling.pop("stop")
    params = SamplingParams(logprobs=args.logprobs, **sampling)
    if args.chat:
        use_chat_template(model, args)
        stop = list(stop) + model.chat_stops()
    prompt = model.chat_prompt([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    piece = lambda t: repr(model.tokenizer.token_to_piece(t))  # noqa: E731
    for c in model.generate_tokens(model.tokenize(prompt, parse_special=args.chat), max_tokens, params, stop):
        top = "  ".join(f"{piece(t)} {lp:.3f}" for t, lp in c.top)
        out.write(f"{c.token:6d} {piece(c.token):20s} {c.logprob:9.4f}   {top}\n")
    model.close()
    return 0


# ---------------------------------------------------------------- eval

@user_errors
def cmd_eval(args) -> int:
    import numpy as np
    model = _load(args, args.model)
    if args.tokens is not None:
        tokens = args.tokens
    elif args.prompt is not None:
        tokens = model.tokenize(args.prompt)
    else:
        print("eval: give --tokens or --prompt", file=sys.stderr)
        return 2
    chunks = args.chunks or [len(tokens)]
    if any(c <= 0 for c in chunks) or sum(chunks) > len(tokens):
        print(f"eval: chunks {chunks} must be positive and add up to at most {len(tokens)} tokens",
              file=sys.stderr)
        return 2
    if sum(chunks) < len(tokens):
        chunks = chunks + [len(tokens) - sum(chunks)]  # the rest in one last call
    start = time.perf_counter()
    parts, pos = [], 0
    for n in chunks:
        parts.append(model.eval(tokens[pos: pos + n]).numpy())
        pos += n
    elapsed = time.perf_counter() - start
    logits = np.concatenate(parts)
    if not _main_rank():  # every rank computed the same logits
        model.close()
        return 0
    if args.out:
        np.save(args.out, logits)
    print(f"{len(tokens)} tokens in {len(chunks)} calls ({elapsed:.3f} s): logits {list(logits.shape)}"
          + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    print("argmax:", ",".join(str(int(i)) for i in logits.argmax(axis=1)))
    model.close()
    return 0


# ---------------------------------------------------------------- info

def _format_value(value, limit: int = 8) -> str:
    if isinstance(value, list):
        head = ", ".join(repr(v) for v in value[:limit])
        more = f", ... ({len(value)} items)" if len(value) > limit else ""
        return f"[{head}{more}]"
    return repr(value)


def info_text(path: str, show_all: bool = False) -> str:
    """The metadata and the tensor/type table of a GGUF file."""
    from ..gguf.loader import open_gguf
    from ..types import type_name
    f = open_gguf(path)
    lines = [f"{path}: GGUF, {len(f.keys)} metadata keys, {len(f.tensors)} tensors, "
             f"data at offset {f.data_offset} (alignment {f.alignment})", "", "metadata:"]
    for key in f.keys:
        n = f.array_length(key)
        if n is not None and n > 64 and not show_all:
            value = f"[{n} items]"  # large arrays (vocabularies) are not decoded
        else:
            value = _format_value(f.get(key), limit=n if show_all and n else 8)
        lines.append(f"  {key} = {value}")
    lines += ["", "tensors:"]
    rows = [(t.name, type_name(t.type), "x".join(str(n) for n in t.ne), f"{t.nbytes / 2**20:.2f}")
            for t in f.tensors.values()]
    header = ("name", "type", "ne", "MiB")
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    for cells in [header, tuple("-" * w for w in widths), *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    n_params = sum(t.n_elements for t in f.tensors.values())
    n_bytes = sum(t.nbytes for t in f.tensors.values())
    counts: dict[str, int] = {}
    for t in f.tensors.values():
        counts[type_name(t.type)] = counts.get(type_name(t.type), 0) + 1
    types = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    lines += ["", f"{n_params:,} parameters, {n_bytes / 2**20:.2f} MiB, "
                  f"{8 * n_bytes / max(n_params, 1):.2f} bits per weight; tensors by type: {types}"]
    return "\n".join(lines)


@user_errors
def cmd_info(args) -> int:
    print(info_text(args.model, args.all))
    return 0


# ---------------------------------------------------------------- wiring

def add_subcommands(subparsers) -> None:
    from ..models.sampling_params import DEFAULTS
    p = subparsers.add_parser("run", help="generate text from a GGUF model (no MODEL: the built-in demo)")
    p.add_argument("model", nargs="?", help="GGUF file (default: the built-in demo model)")
    p.add_argument("-p", "--prompt", default="Once upon a time", help="the prompt")
    p.add_argument("-n", "--n-predict", type=int, default=64, metavar="N", help="tokens to generate")
    p.add_argument("--temp", type=float, default=DEFAULTS.temperature, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=DEFAULTS.top_k, help="sample from the K most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=DEFAULTS.top_p, help="nucleus sampling's probability mass (1: off)")
    p.add_argument("-s", "--seed", type=int, default=None, help="sampling seed (default: a random one)")
    p.add_argument("--min-p", type=float, default=DEFAULTS.min_p, help="drop tokens below min_p x the top probability")
    p.add_argument("--repeat-penalty", type=float, default=DEFAULTS.repeat_penalty, help="llama.cpp's repetition penalty (1: off)")
    p.add_argument("--repeat-last-n", type=int, default=DEFAULTS.repeat_last_n, help="tokens the penalties look back at (-1: all)")
    p.add_argument("--frequency-penalty", type=float, default=DEFAULTS.frequency_penalty, help="subtracted per earlier occurrence")
    p.add_argument("--presence-penalty", type=float, default=DEFAULTS.presence_penalty, help="subtracted once a token occurred")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop at this text (repeatable)")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="print each token with its log-probability and the N most likely alternatives")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as a user message through the model's chat template")
    add_chat_template_option(p)
    add_warmup_option(p)
    p.add_argument("--mmproj", metavar="FILE", help="the model's multimodal projector (mmproj GGUF), for --image")
    p.add_argument("--image", action="append", metavar="FILE",
                   help="an image for the prompt's next <__media__> marker (repeatable; no marker: before the prompt)")
    add_model_options(p)
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser("eval", help="evaluate token ids and write the logits as .npy")
    p.add_argument("model", help="GGUF file")
    p.add_argument("--tokens", type=int_list, metavar="1,2,3", help="token ids")
    p.add_argument("--prompt", help="text to tokenize instead of --tokens")
    p.add_argument("--chunks", type=int_list, metavar="48,1,1",
                   help="evaluate the tokens in calls of these sizes (the rest in one last call)")
    p.add_argument("-o", "--out", metavar="FILE.npy", help="where to write the float32 [n_tokens, n_vocab] logits")
    add_model_options(p)
    p.set_defaults(func=cmd_eval)

    p = subparsers.add_parser("info", help="print a GGUF file's metadata and tensor table")
    p.add_argument("model", help="GGUF file")
    p.add_argument("--all", action="store_true", help="print every array value in full")
    p.set_defaults(func=cmd_info)


def main(argv=None) -> int:
    """Run these subcommands on their own: python -m torchggml.cli.models run ..."""
    parser = argparse.ArgumentParser(prog="torchggml")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
