"""Our plain lane and DART beside llama.cpp's plain decoding of the same weights, on the same prompts.

    python -m studies.beside_llama_cpp gguf --out runs/llama/smollm2-f32.gguf            # F32 (or --type f16)
    python -m studies.beside_llama_cpp prompts --out runs/llama/prompts.json             # the 20-prompt check's ids
    LLAMA_PYTHON=/path/to/venv/bin/python python -m studies.beside_llama_cpp llama runs/llama/smollm2-f32.gguf \\
        runs/llama/prompts.json --out runs/llama/llama-f32.json                          # llama-cpp-python, 2 threads
    python -m studies.beside_llama_cpp ours runs/llama/prompts.json --methods vanilla,dart,dart_pld,hf_generate \\
        --dtype auto --out runs/llama/ours-fp32.json
    python -m studies.beside_llama_cpp compare runs/llama/llama-f32.json runs/llama/ours-fp32.json

The GGUF is the default model's own Q4_1 file with every tensor dequantized (F32: exactly the weights our fp32 engine
decodes, which it dequantizes the same way; F16: those rounded to half precision). llama-cpp-python is not one of the
project's dependencies; build it for the CPU at hand in a venv of its own (`CMAKE_ARGS="-DGGML_NATIVE=ON" pip install
llama-cpp-python`) and name that venv's Python in LLAMA_PYTHON. Greedy, 128 new tokens, cut after a stop token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

LLAMA_SIDE = """
import json, sys, time
from llama_cpp import Llama
data = json.load(open(sys.argv[2])); stops = set(data["stops"]); limit = int(sys.argv[3])
llm = Llama(sys.argv[1], n_ctx=2048, n_threads=int(sys.argv[4]), n_batch=512, verbose=False)
outs, tokens, seconds = [], 0, 0.0
for ids in data["prompts"]:
    t0, out = time.perf_counter(), []
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(int(tok))
        if tok in stops or len(out) >= limit:
            break
    seconds += time.perf_counter() - t0; tokens += len(out); outs.append(out)
print(json.dumps({"llama.cpp": {"tokens_per_s": tokens / seconds, "outputs": outs}}))
"""


def write_gguf(out: Path, kind: str) -> None:
    import gguf
    from gguf.quants import dequantize

    from dart_core.setup.models import default_gguf_path
    reader = gguf.GGUFReader(default_gguf_path())
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        sub = {"sub_type": f.types[-1]} if f.types[0] == gguf.GGUFValueType.ARRAY else {}
        writer.add_key_value(name, f.contents(), f.types[0], **sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if kind == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    for t in reader.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        if kind == "f16" and len(t.shape) > 1:     # matrices in half precision, norms stay F32 (as llama.cpp's own)
            data = data.astype(np.float16)
        writer.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()


def write_prompts(out: Path) -> None:
    """The bench's 20-prompt check (`--workloads mtbench,humaneval --limit 10`), as the bench tokenizes it."""
    from dart_core.setup.chat import encode_prompt
    from dart_core.setup.loading import load_target, stop_ids
    from dart_core.tools.bench import load_prompts
    target = load_target("default")
    prompts, _ = load_prompts(["mtbench", "humaneval"], None, 10)
    out.write_text(json.dumps({"prompts": [encode_prompt(target.tokenizer, p.text, raw=p.raw) for p in prompts],
                               "stops": sorted(stop_ids(target))}))


def ours(prompts: dict, methods: list[str], dtype: str, limit: int) -> dict:
    import torch

    from dart_core.decoding import GenerationConfig, run
    from dart_core.setup.defaults import default_search_config
    from dart_core.setup.loading import DraftSettings, load
    loaded = load("default", dtype=dtype)
    # the automatic budget from where the command line starts it (a CPU's 8 nodes, not the reference's 60)
    settings = DraftSettings(default_search_config(loaded.target.device.type), auto_budget=True)
    config = GenerationConfig(max_new_tokens=limit, stop_ids=frozenset(prompts["stops"]))
    results = {"forward": loaded.target.forward_kind}
    for method in methods:
        outs, tokens, seconds = [], 0, 0.0
        decode = _generate(loaded.target.model, prompts["stops"], limit) if method == "hf_generate" else \
            _ours(loaded.target, loaded.proposer(method, settings), config, run)
        decode(prompts["prompts"][0][:8])                     # warm-up: kernels, caches, the budget's curve
        for ids in prompts["prompts"]:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = decode(ids)
            seconds += time.perf_counter() - t0
            tokens += len(out)
            outs.append(out)
        results[method] = {"tokens_per_s": tokens / seconds, "outputs": outs}
    return results


def _ours(target, proposer, config, run):
    return lambda ids: run(target, proposer, ids, config).output_ids


def _generate(model, stops: list[int], limit: int):
    import torch

    def decode(ids):
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=limit, do_sample=False,
                             eos_token_id=stops, pad_token_id=stops[0])[0, len(ids):].tolist()
        cut = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
        return out[:cut]
    return decode


def compare(files: list[Path]) -> None:
    lanes = {}
    for f in files:
        data = json.loads(f.read_text())
        lanes.update({f"{k} ({f.stem})": v for k, v in data.items() if isinstance(v, dict)})
    first = next(iter(lanes.values()))["outputs"]
    for name, lane in lanes.items():
        same = sum(a == b for a, b in zip(lane["outputs"], first))
        print(f"{name:40} {lane['tokens_per_s']:7.1f} tok/s  identical to the first: {same}/{len(first)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.beside_llama_cpp")
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gguf")
    g.add_argument("--out", required=True)
    g.add_argument("--type", choices=("f32", "f16"), default="f32")
    sub.add_parser("prompts").add_argument("--out", required=True)
    ll = sub.add_parser("llama")
    ll.add_argument("gguf"), ll.add_argument("prompts"), ll.add_argument("--out", required=True)
    ll.add_argument("--threads", type=int, default=2)
    o = sub.add_parser("ours")
    o.add_argument("prompts"), o.add_argument("--out", required=True)
    o.add_argument("--methods", default="vanilla,dart,dart_pld,hf_generate")
    o.add_argument("--dtype", default="auto")
    c = sub.add_parser("compare")
    c.add_argument("files", nargs="+")
    for q in (ll, o):
        q.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    if args.what == "gguf":
        write_gguf(Path(args.out), args.type)
    elif args.what == "prompts":
        write_prompts(Path(args.out))
    elif args.what == "llama":
        python = os.environ.get("LLAMA_PYTHON", sys.executable)
        done = subprocess.run([python, "-c", LLAMA_SIDE, args.gguf, args.prompts, str(args.max_new_tokens),
                               str(args.threads)], capture_output=True, text=True, check=True)
        Path(args.out).write_text(done.stdout.strip().splitlines()[-1])
    elif args.what == "ours":
        prompts = json.loads(Path(args.prompts).read_text())
        result = ours(prompts, args.methods.split(","), args.dtype, args.max_new_tokens)
        forward = lambda method: "transformers" if method == "hf_generate" else result["forward"]   # noqa: E731
        Path(args.out).write_text(json.dumps({f"{k} {forward(k)}": v for k, v in result.items()
                                              if isinstance(v, dict)}))
    else:
        compare([Path(f) for f in args.files])
    return 0


if __name__ == "__main__":
    sys.exit(main())
