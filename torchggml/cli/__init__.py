"""The `torchggml` command.

    torchggml devices                       regs and devices: type, memory, capabilities, features
    torchggml test-ops [-b DEV] [-o OP] [-p REGEX] [-m test|grad|perf|support] [--full]
                       [--list-ops] [--show-coverage] [--output console|csv] [--kernels FILE.py]
                       [--roofline FILE.png]
                                            test-backend-ops for this project (torchggml.test_ops.runner)
    torchggml run / eval / info             models (torchggml/cli/models.py)
    torchggml serve                         the OpenAI-compatible server (torchggml/server/)
    torchggml perplexity / bench / quantize the tools (torchggml/tools/)
    torchggml --version
    torchggml rpc-server [--host H] [--port P] [--device DEV ...] [--cache DIR] [--threads N]
                         [--max-connections N] [--*-timeout S] [--client-memory SIZE]
                                            serve devices to ggml RPC clients (llama.cpp --rpc)
"""
from __future__ import annotations

import argparse
import os
import sys


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def _caps(caps) -> str:
    flags = [("async", caps.async_), ("host_buffer", caps.host_buffer),
             ("from_host_ptr", caps.buffer_from_host_ptr), ("events", caps.events)]
    return ",".join(name for name, on in flags if on) or "-"


def device_rows() -> list[tuple[str, ...]]:
    """One row per device: reg, name, type, free MiB, total MiB, caps, description."""
    import torchggml as ggml
    rows = []
    for r in range(ggml.backend_reg_count()):
        reg = ggml.backend_reg_get(r)
        for d in range(ggml.backend_reg_dev_count(reg)):
            props = ggml.backend_dev_get_props(ggml.backend_reg_dev_get(reg, d))
            rows.append((ggml.backend_reg_name(reg), props.name, props.type.name, _mib(props.memory_free),
                         _mib(props.memory_total), _caps(props.caps), props.description))
    return rows


def meta_device_rows(specs) -> list[tuple[str, ...]]:
    """Rows for meta devices: one per spec "DEV,DEV,..." (default: all accelerators when there
    are two or more)."""
    import torchggml as ggml
    if not specs:
        accel = [ggml.backend_dev_get(i) for i in range(ggml.backend_dev_count())]
        accel = [d for d in accel if d.get_type() != ggml.DeviceType.CPU]
        specs = [",".join(d.get_name() for d in accel)] if len(accel) >= 2 else []
    rows = []
    for spec in specs:
        props = ggml.backend_dev_get_props(ggml.backend_meta_device([x for x in spec.split(",") if x]))
        rows.append(("(meta)", props.name, props.type.name, _mib(props.memory_free),
                     _mib(props.memory_total), _caps(props.caps), "tensor parallel over " + spec))
    return rows


def format_table(header, rows) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line("-" * w for w in widths), *map(line, rows)])


def cmd_devices(args) -> int:
    import torchggml as ggml
    if args.load_all:
        ggml.backend_load_all()
    for endpoint in (args.rpc or "").split(","):
        if endpoint:
            try:
                ggml.backend_register(ggml.backend_rpc_add_server(endpoint))
            except (ConnectionError, ValueError) as e:
                print(f"torchggml devices: error: {e}", file=sys.stderr)
                return 1
    header = ("reg", "device", "type", "free MiB", "total MiB", "caps", "description")
    rows = device_rows()
    rows += meta_device_rows(args.meta)
    print(format_table(header, rows))
    print(f"\n{ggml.backend_reg_count()} regs, {len(rows)} devices")
    for reg, features in reg_features():
        print(f"{reg} features: {features}")
    return 0


def reg_features() -> list[tuple[str, str]]:
    """(reg name, "NAME = value, ...") for each reg with ggml_backend_get_features (the CPU's:
    its CPU features and the quantized product path chosen for them)."""
    import torchggml as ggml
    out = []
    for r in range(ggml.backend_reg_count()):
        reg = ggml.backend_reg_get(r)
        get = reg.get_proc_address("ggml_backend_get_features")
        if get is not None:
            out.append((ggml.backend_reg_name(reg), ", ".join(f"{k} = {v}" for k, v in get().items())))
    return out


def cmd_test_ops(args) -> int:
    from torchggml.test_ops.command import main  # the op-case table is large: import on demand
    from torchggml.devices.kernels.registered import load_kernel_files
    try:
        load_kernel_files(args.kernels)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"torchggml test-ops: error: {e}", file=sys.stderr)
        return 2
    return main(args)


def add_case_options(p: argparse.ArgumentParser) -> None:
    """test-ops options choosing cases and reporting (torchggml.test_ops.command)."""
    p.add_argument("-p", "--params", metavar="REGEX", help="only cases whose name matches REGEX")
    p.add_argument("--full", action="store_true",
                   help="every case of upstream's breadth (default: a representative sample; "
                        "also TORCHGGML_TEST_OPS_FULL=1)")
    p.add_argument("--list-ops", action="store_true", help="list the ops and their case counts")
    p.add_argument("--show-coverage", action="store_true",
                   help="ops and cases per device against upstream's test-backend-ops")
    p.add_argument("--output", choices=("console", "csv"), default="console", help="output format")


def add_perf_options(p: argparse.ArgumentParser) -> None:
    """test-ops options for kernel developers: registered kernels, timing, the roofline."""
    from .models import add_kernels_option
    add_kernels_option(p)
    p.add_argument("--roofline", metavar="FILE.png",
                   help="with -m perf: plot each timed case against the device's measured copy bandwidth "
                        "and matmul peak (needs matplotlib: pip install torchggml[plot])")
    p.add_argument("--min-seconds", type=float, default=0.2, metavar="S",
                   help="with -m perf: time each case for at least S seconds (default 0.2)")


def version_text() -> str:
    """torchggml's version (the installed package's, else the source tree's), with torch's."""
    from importlib import metadata
    try:
        version = metadata.version("torchggml")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    try:  # torch's installed version, without importing torch
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"torchggml {version} (torch {torch_version})"


def parse_size(text: str) -> int | None:
    """--client-memory: "8G", "512M", "4096", "device" (-1: the server picks) or "none" (None)."""
    text = str(text).strip().lower()
    if text in ("device", "none"):
        return -1 if text == "device" else None
    scale = 1 << 10 * "kmgt".index(text[-1]) + 10 if text[-1:] in ("k", "m", "g", "t") else 1
    digits = text[:-1] if scale > 1 else text
    try:
        value = float(digits)
    except ValueError:
        raise ValueError(f"--client-memory {text!r} is not a size (e.g. 8G, 512M, 4096, none)") from None
    if value < 0:
        raise ValueError(f"--client-memory {text!r} is negative")
    return int(value * scale)


def cmd_rpc_server(args) -> int:
    import logging
    from torchggml.devices.rpc import RPCServer
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    devices = [d for spec in args.device or () for d in spec.split(",") if d] or None
    try:
        server = RPCServer(f"{args.host}:{args.port}", devices, args.cache, args.threads, args.max_connections,
                           args.handshake_timeout, args.message_timeout, args.idle_timeout,
                           parse_size(args.client_memory))
    except (ValueError, OSError) as e:
        print(f"torchggml rpc-server: error: {e}", file=sys.stderr)
        return 1
    print(server.describe(), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


class DefaultsFormatter(argparse.HelpFormatter):
    """Every option's default in its help, unless the help already says it (or there is none)."""

    def _get_help_string(self, action):
        help = action.help or ""
        if (action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in help
                and action.option_strings and not isinstance(action, argparse._StoreConstAction)):
            default = ",".join(map(str, action.default)) if isinstance(action.default, list) else action.default
            help += f" (default: {default})"
        return help


class VersionAction(argparse.Action):
    """--version: the version_text, looked up only when asked for."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse's parser with DefaultsFormatter; its subcommands' parsers are Parsers too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="torchggml", description="ggml's backend system on PyTorch")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("devices", help="list regs and devices with type, memory and capabilities")
    p.add_argument("--load-all", action="store_true",
                   help="first load plugins (entry points and TORCHGGML_BACKEND_PATH)")
    p.add_argument("--meta", action="append", metavar="DEV,DEV,...",
                   help="also show the meta device over these devices (tensor parallel); "
                        "default: over all accelerators when there are two or more")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT...]", help="also list these RPC servers' devices")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("test-ops", help="run the op cases on devices against the CPU reference")
    p.add_argument("-b", "--backend", metavar="DEVICE", help="only this device (e.g. SIM0, CUDA0)")
    p.add_argument("-o", "--op", metavar="OP", help="only this op (e.g. MUL_MAT)")
    p.add_argument("-m", "--mode", choices=("test", "grad", "perf", "support"), default="test",
                   help="test: compare with the CPU (the CPU with float64 references); grad: ggml's backward "
                        "vs finite differences; perf: time per run; support: what each device supports")
    add_case_options(p)
    add_perf_options(p)
    p.set_defaults(func=cmd_test_ops)

    p = sub.add_parser("rpc-server", help="serve devices over ggml's RPC protocol (llama.cpp --rpc clients)")
    p.add_argument("-H", "--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; ggml's RPC has no authentication: "
                        "never expose it to an open network)")
    p.add_argument("-p", "--port", type=int, default=50052, help="port (default 50052, 0: any free port)")
    p.add_argument("-d", "--device", action="append", metavar="DEV[,DEV...]",
                   help="devices to serve, e.g. CPU, CUDA0, SIM0 (default: the first GPU, else the CPU)")
    p.add_argument("-c", "--cache", metavar="DIR", help="keep weights in DIR so that clients need not resend them")
    p.add_argument("-t", "--threads", type=int, help="CPU threads of the served backends")
    p.add_argument("--max-connections", type=int, default=64, help="clients served at once (default 64)")
    p.add_argument("--handshake-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a new connection has to send HELLO (default 10; 0: no limit)")
    p.add_argument("--message-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a message (or the reading of its answer) may stall (default 30; 0: no limit)")
    p.add_argument("--idle-timeout", type=float, default=600.0, metavar="S",
                   help="seconds between messages after which a connection without buffers is closed, and "
                        "one with buffers when another client needs its slot (default 600; 0: never)")
    p.add_argument("--client-memory", default="device", metavar="SIZE",
                   help="bytes of buffers one connection may hold, e.g. 8G, 512M (default 'device': the "
                        "largest served device's total memory; 'none': no quota)")
    p.add_argument("-v", "--verbose", action="store_true", help="log connections and commands' failures")
    p.set_defaults(func=cmd_rpc_server)

    from .models import add_subcommands as add_model_subcommands  # run, eval, info
    add_model_subcommands(sub)
    from .serve import add_subcommands as add_server_subcommands  # serve
    add_server_subcommands(sub)
    from .tools import add_subcommands as add_tool_subcommands  # perplexity, bench, quantize
    add_tool_subcommands(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rc = 1
    try:
        rc = args.func(args)
        return rc
    finally:
        if "torchggml.models.tensor_parallel" in sys.modules:  # only a command that used it has a group to end
            from ..models.tensor_parallel import end_dist_group
            if end_dist_group():
                # a torchrun rank that started its process group leaves at once: destructors that run
                # at interpreter exit can still meet gloo's threads and abort the rank
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc if isinstance(rc, int) else 1)


if __name__ == "__main__":
    sys.exit(main())
