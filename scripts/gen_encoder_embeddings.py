"""Regenerate llama.cpp's reference embeddings for the tiny encoders of torchggml/gguf/writer/tiny.py.

    python scripts/gen_encoder_embeddings.py [CASE ...]   # default: every encoder case and weight type

For each encoder case and weight type: write the model (deterministic writer) into a temporary
directory and, for each pooling llama.cpp has (none, mean, cls, last; rank where the case has a
classifier head), evaluate its tokens in one batch through llama-cpp-python's low-level API
(llama_decode, or llama_encode for a model without a decoder, t5encoder; embeddings on, that pooling type, CPU, 2 threads) and keep llama_get_embeddings_ith (none) or
llama_get_embeddings_seq (the others), unnormalized, in tests/data/encoders/<case>-<type>.npz;
tests/data/encoders/manifest.json records the tokens and the model file's sha256. Each model runs
in a child process (llama.cpp's threads stay out of this one).
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
DATA = ROOT / "tests" / "data" / "encoders"
N_CTX = 256
POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama_pooling_type

CHILD = """
import sys, numpy as np, llama_cpp as L
path, out, tokens, poolings = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")], sys.argv[4]
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
n_embd, n_cls = L.llama_model_n_embd(model), L.llama_model_n_cls_out(model)
result = {}
for item in poolings.split(","):
    name, ptype = item.split("=")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = %d, 64, 64, 2, 2
    cp.embeddings, cp.pooling_type = True, int(ptype)
    ctx = L.llama_init_from_model(model, cp)
    n = len(tokens)
    batch = L.llama_batch_init(n, 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, True
        batch.seq_id[i][0] = 0
    batch.n_tokens = n
    # an encoder without a decoder (t5encoder) runs through llama_encode, as llama-embedding does
    run = L.llama_decode if L.llama_model_has_decoder(model) else L.llama_encode
    assert run(ctx, batch) == 0, name
    if name == "none":
        rows = [np.ctypeslib.as_array(L.llama_get_embeddings_ith(ctx, i), shape=(n_embd,)).copy() for i in range(n)]
        result[name] = np.stack(rows)
    else:
        width = n_cls if name == "rank" else n_embd
        result[name] = np.ctypeslib.as_array(L.llama_get_embeddings_seq(ctx, 0), shape=(width,)).copy()
    L.llama_batch_free(batch)
    L.llama_free(ctx)
np.savez(out, **{k: v.astype(np.float32) for k, v in result.items()})
""" % N_CTX


def format_manifest(manifest: dict) -> str:
    rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(manifest.items())]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def poolings(case) -> list[str]:
    return ["none", "mean", "cls", "last"] + (["rank"] if "cls_out" in case.features or "cls" in case.features else [])


def main(argv=None) -> int:
    from torchggml.gguf.writer.tiny import TINY_CASES, file_sha256, write_tiny_model
    from torchggml.models.archs import ARCHS
    import llama_cpp
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", help="case names (default: every encoder case)")
    args = p.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    manifest_path = DATA / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    cases = [c for c in TINY_CASES if ARCHS[c.arch].encoder and (not args.cases or c.name in args.cases)]
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            for wtype in case.weight_types:
                key = f"{case.name}-{wtype}"
                model = write_tiny_model(Path(tmp) / f"{key}.gguf", case, wtype)
                out = DATA / f"{key}.npz"
                names = poolings(case)
                spec = ",".join(f"{n}={POOLING_TYPES[n]}" for n in names)
                if subprocess.run([sys.executable, "-c", CHILD, model, str(out), ",".join(map(str, case.tokens)),
                                   spec]).returncode:
                    failed.append(key)
                    print(f"{key}: llama.cpp failed", file=sys.stderr)
                    continue
                manifest[key] = {"case": case.name, "arch": case.arch, "weights": wtype, "tokens": list(case.tokens),
                                 "poolings": names, "sha256": file_sha256(model), "embeddings": out.name,
                                 "n_ctx": N_CTX, "llama_cpp_python": llama_cpp.__version__}
                manifest_path.write_text(format_manifest(manifest))
                print(f"{key}: {out.relative_to(ROOT)}", file=sys.stderr)
    if failed:
        print(f"llama.cpp failed on: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
