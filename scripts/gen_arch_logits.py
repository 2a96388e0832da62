"""Regenerate llama.cpp's reference logits for the tiny models of torchggml/gguf/writer/tiny.py.

    python scripts/gen_arch_logits.py [CASE ...]      # default: every case and weight type

For each case and weight type: write the model (deterministic writer) into a temporary
directory, evaluate its tokens in one batch with llama-cpp-python (CPU, 2 threads, default F16
KV cache, no flash attention, logits_all) and write tests/data/archs/<case>-<type>.npy (an
encoder-decoder case, t5: its first n_encoder tokens through llama_encode, the others through
llama_decode, whose logits are written); the
manifest tests/data/archs/manifest.json records the tokens and the model file's sha256, so the
tests know they regenerated the same file. Each model runs in a child process (llama.cpp's
threads stay out of this one).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "archs"
N_CTX = 256

CHILD = """
import sys, numpy as np, llama_cpp
path, out, tokens = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")]
llm = llama_cpp.Llama(model_path=path, n_ctx=%d, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
                      flash_attn=False, verbose=False)
llm.eval(tokens)
np.save(out, np.array(llm.scores[: len(tokens)], dtype=np.float32))
""" % N_CTX

# encoder-decoder models (t5): llama_encode over the first n_encoder tokens, then llama_decode
ENCODER_DECODER_CHILD = """
import sys, numpy as np, llama_cpp
path, out, tokens, n_enc = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")], int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=%d, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
                      flash_attn=False, verbose=False)
ctx, n_vocab = llm._ctx.ctx, llm.n_vocab()
batch = llama_cpp.llama_batch_init(64, 0, 1)
def run(fn, part, logits):
    batch.n_tokens = len(part)
    for i, t in enumerate(part):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, logits
        batch.seq_id[i][0] = 0
    if fn(ctx, batch) != 0:
        sys.exit(f"{fn.__name__} failed")
run(llama_cpp.llama_encode, tokens[:n_enc], False)
run(llama_cpp.llama_decode, tokens[n_enc:], True)
np.save(out, np.array([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                       for i in range(len(tokens) - n_enc)], dtype=np.float32))
""" % N_CTX


def format_manifest(manifest: dict) -> str:
    """One line per model, sorted."""
    rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(manifest.items())]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def main(argv=None) -> int:
    from torchggml.gguf.writer.tiny import TINY_CASES, file_sha256, write_tiny_model
    import llama_cpp
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", help="case names (default: all)")
    args = p.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    manifest_path = DATA / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    cases = [c for c in TINY_CASES if not args.cases or c.name in args.cases]
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            for wtype in case.weight_types:
                key = f"{case.name}-{wtype}"
                model = write_tiny_model(Path(tmp) / f"{key}.gguf", case, wtype)
                out = DATA / f"{key}.npy"
                tokens = ",".join(map(str, case.tokens))
                child = [CHILD] if not case.n_encoder else [ENCODER_DECODER_CHILD]
                extra = [str(case.n_encoder)] if case.n_encoder else []
                if subprocess.run([sys.executable, "-c", *child, model, str(out), tokens, *extra]).returncode:
                    failed.append(key)  # llama.cpp refused the file or failed: nothing recorded
                    print(f"{key}: llama.cpp failed", file=sys.stderr)
                    continue
                manifest[key] = {"case": case.name, "arch": case.arch, "weights": wtype, "tokens": list(case.tokens),
                                 "sha256": file_sha256(model), "logits": out.name, "n_ctx": N_CTX,
                                 "llama_cpp_python": llama_cpp.__version__}
                manifest_path.write_text(format_manifest(manifest))
                print(f"{key}: {out.relative_to(ROOT)}", file=sys.stderr)
    if failed:
        print(f"llama.cpp failed on: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
