"""The table of architectures x weight types against llama.cpp's logits (tests/data/archs): the
relative L2 error and the argmax agreement of torchggml's logits, evaluated in one batch and as
a prompt followed by decode steps, flash attention off and on.

    python scripts/arch_table.py [--device CPU] [--arch NAME ...]
(The supported architectures, from the code: the README's table, python scripts/support_table.py.)

The last lines count the architectures checked and those over the golden tests' thresholds
(relative L2 2e-3 for F32/F16, 4e-2 for quantized weights; argmax agreement 0.9).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "archs"


def main(argv=None) -> int:
    from torchggml.models import load_model
    from torchggml.gguf.writer.tiny import CASES_BY_NAME, file_sha256, write_tiny_model
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="CPU")
    p.add_argument("--arch", nargs="*", help="only these general.architecture values")
    args = p.parse_args(argv)
    from torchggml.models.archs import ARCHS
    manifest = json.loads((DATA / "manifest.json").read_text())
    if args.arch:
        manifest = {k: e for k, e in manifest.items() if e["arch"] in args.arch}
    failed = []
    print(f"| architecture (case) | weights | FA | rel. L2 batch | rel. L2 steps | argmax batch | argmax steps |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for key, e in manifest.items():
            case = CASES_BY_NAME[e["case"]]
            path = write_tiny_model(Path(tmp) / f"{key}.gguf", case, e["weights"])
            if file_sha256(path) != e["sha256"]:
                print(f"{key}: the regenerated file differs from the reference's", file=sys.stderr)
                continue
            ref = np.load(DATA / e["logits"])
            for fa in (False, True):
                model = load_model(path, devices=[args.device], n_ctx=e["n_ctx"], flash_attn=fa, progress=False)
                t, n_prompt = e["tokens"][case.n_encoder:], case.n_prompt - case.n_encoder
                if case.n_encoder:  # encoder-decoder (t5): the decoder reads the encoded first tokens
                    model.encode(e["tokens"][:case.n_encoder])
                batch = model.eval(t).numpy()
                model.reset()
                steps = torch.cat([model.eval(t[:n_prompt])] + [model.eval([x]) for x in t[n_prompt:]]).numpy()
                model.close()
                errs = [np.linalg.norm(o - ref) / np.linalg.norm(ref) for o in (batch, steps)]
                agree = [(o.argmax(1) == ref.argmax(1)).mean() for o in (batch, steps)]
                print(f"| {e['arch']} ({e['case']}) | {e['weights']} | {'on' if fa else 'off'} | {errs[0]:.1e} | "
                      f"{errs[1]:.1e} | {agree[0]:.2f} | {agree[1]:.2f} |", flush=True)
                max_err = 2e-3 if e["weights"] in ("F32", "F16") else 4e-2
                if max(errs) > max_err or min(agree) < 0.9:
                    failed.append(f"{key} FA {'on' if fa else 'off'}")
    archs = sorted({e["arch"] for e in manifest.values()})
    print(f"\n{len(archs)} architectures checked against llama.cpp ({len(manifest)} models); "
          f"{len(ARCHS)} supported in all; over the thresholds: {', '.join(failed) or 'none'}")
    unchecked = sorted(set(ARCHS) - set(archs))
    if unchecked and not args.arch:
        print(f"supported without a tiny model here: {', '.join(unchecked)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
