"""`torchggml imatrix MODEL -f TEXT -o imatrix.gguf`: an importance matrix as llama-imatrix collects it.

For every matrix product with a model weight (MUL_MAT whose weight is a blk.* tensor, output.weight
with --process-output; every MUL_MAT_ID, per expert), the scheduler's eval callback adds the
squares of the activations entering it, per input column: in_sum2[j] += x[j]^2 over every token
row, and counts the rows (per expert for MUL_MAT_ID, through the routing ids). Products of fewer
than 16 rows are skipped, as llama-imatrix skips them.

The text is cut as llama-imatrix cuts it: tokenized with BOS, n_tokens // n_ctx chunks of n_ctx
tokens, each evaluated on an empty cache with its first token replaced by BOS; its perplexity over
each chunk's second half (tools/perplexity.py's scoring) is printed as it goes.

The file is llama.cpp's imatrix GGUF: general.type = "imatrix", imatrix.datasets (the text's
path), imatrix.chunk_count, imatrix.chunk_size (n_ctx), and per weight NAME.in_sum2 (F32,
ne [n_per_row, n_mat]) and NAME.counts (F32, ne [1, n_mat]), tensors sorted by name.
`torchggml quantize --imatrix FILE` and llama-quantize read it (quantize.load_imatrix: sums
divided by counts).
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

MIN_ROWS = 16  # llama-imatrix ignores products of fewer token rows


class Collector:
    """The eval callback's state: {weight name: [float32 sums [n_mat, ne0], int64 counts [n_mat]]}."""

    def __init__(self, process_output: bool = False):
        self.stats: dict[str, list] = {}
        self.process_output = process_output

    def __call__(self, t, ask: bool) -> bool:
        from ..enums import Op
        from ..backend.tensor_io import backend_tensor_get
        src0, src1 = t.src[0], t.src[1]
        name = src0.name
        if ask:
            if t.op == Op.MUL_MAT_ID:
                return True
            if t.op != Op.MUL_MAT or src1.ne[1] < MIN_ROWS or int(src1.type) != 0:
                return False
            return name.startswith("blk.") or (self.process_output and name == "output.weight")
        x = backend_tensor_get(src1).float().reshape(int(src1.ne[3]), int(src1.ne[2]), int(src1.ne[1]),
                                                      int(src1.ne[0]))
        ne0 = int(src1.ne[0])
        if t.op == Op.MUL_MAT_ID:
            n_as = int(src0.ne[2])
            ids = backend_tensor_get(t.src[2]).to(torch.int64).reshape(-1, int(t.src[2].ne[0]))  # [tokens, used]
            sums, counts = self._entry(name, n_as, ne0)
            xs = x[0]  # [tokens, ne1, ne0]
            for idx in range(ids.shape[1]):
                rows = xs[:, idx % xs.shape[1]]
                ex = ids[:, idx]
                if bool(((ex < 0) | (ex >= n_as)).any()):
                    raise RuntimeError(f"imatrix: expert id out of range in {name}")
                sums.index_add_(0, ex, rows * rows)
                counts.index_add_(0, ex, torch.ones_like(ex))
        else:
            n_mat = int(src0.ne[2]) * int(src0.ne[3])
            sums, counts = self._entry(name, n_mat, ne0)
            sq = (x * x).sum(dim=2)  # [ne3, ne2, ne0]: the rows of each matrix
            for i3 in range(sq.shape[0]):
                for i2 in range(sq.shape[1]):
                    sums[(i3 % int(src0.ne[3])) * int(src0.ne[2]) + (i2 % int(src0.ne[2]))] += sq[i3, i2]
            counts += x.shape[0] * x.shape[1] * x.shape[2] // n_mat
        if not bool(torch.isfinite(sums).all()):
            raise RuntimeError(f"imatrix: non-finite values collected for {name}")
        return True

    def _entry(self, name: str, n_mat: int, ne0: int):
        e = self.stats.get(name)
        if e is None:
            e = self.stats[name] = [torch.zeros(n_mat, ne0), torch.zeros(n_mat, dtype=torch.int64)]
        elif tuple(e[0].shape) != (n_mat, ne0):
            raise RuntimeError(f"imatrix: inconsistent size for {name}: {tuple(e[0].shape)} vs {(n_mat, ne0)}")
        return e


def collect(model, text: str, max_chunks: int | None = None, process_output: bool = False, progress=None):
    """(Collector, perplexity result) over `text` in chunks of model.n_ctx tokens."""
    from .perplexity import eval_window, score_window, summarize, windows
    from ..backend.sched import backend_sched_set_eval_callback
    tok = model.tokenizer
    tokens = model.tokenize(text, add_special=True)
    ws = windows(tokens, model.n_ctx, tok.bos_id if tok.add_bos else None)
    if max_chunks is not None:
        ws = ws[:max_chunks]
    collector = Collector(process_output)
    nlls, start = [], time.perf_counter()
    backend_sched_set_eval_callback(model.sched, collector)
    try:
        for i, w in enumerate(ws):
            nlls.append(score_window(eval_window(model, w), w))
            if progress is not None:
                progress(i, len(ws), summarize(nlls).ppl, time.perf_counter() - start)
    finally:
        backend_sched_set_eval_callback(model.sched, None)
    return collector, summarize(nlls, time.perf_counter() - start), len(ws)


def write_imatrix(path: str, stats: dict, datasets: list[str], chunk_count: int, chunk_size: int) -> None:
    """llama.cpp's imatrix GGUF (see the module's docstring)."""
    import gguf
    writer = gguf.GGUFWriter(path, "")
    writer.kv_data[0].pop("general.architecture", None)  # llama-imatrix's file has none
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", list(datasets))
    writer.add_uint32("imatrix.chunk_count", chunk_count)
    writer.add_uint32("imatrix.chunk_size", chunk_size)
    for name in sorted(stats):
        sums, counts = stats[name]
        writer.add_tensor(f"{name}.in_sum2", sums.numpy().astype(np.float32))
        writer.add_tensor(f"{name}.counts", counts.numpy().astype(np.float32).reshape(-1, 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cmd_imatrix(args, params) -> int:
    """The command, given its arguments and the ModelParams the CLI made of them."""
    from .perplexity import model_and_text
    model, text = model_and_text(args, params)

    def progress(i, n, ppl, seconds):
        print(f"\rimatrix: chunk {i + 1}/{n}, PPL {ppl:.4f}, {seconds / (i + 1):.1f} s a chunk",
              end="" if i + 1 < n else "\n", file=sys.stderr, flush=True)

    collector, r, n_chunks = collect(model, text, args.chunks, args.process_output, progress)
    n_ctx = model.n_ctx
    model.close()
    write_imatrix(args.output, collector.stats, [args.file], n_chunks, n_ctx)
    print(f"{args.output}: {len(collector.stats)} entries from {n_chunks} chunks of {n_ctx} tokens; "
          f"Final estimate: PPL = {r.ppl:.4f} +/- {r.stderr:.5f}")
    return 0
