"""``radixchat bench cpu``: which CPU backend setup runs a model fastest.

Every combination of OpenBLAS {loaded, not loaded} x weights {stored, float32, float16,
bfloat16} is measured: prefill tokens/s for a ``P``-token prompt from an empty cache, and
decode tokens/s over ``D`` greedy tokens after it (the median of ``N`` repetitions, after
one warm-up), plus load time and weight bytes. OpenBLAS has to be loaded before mlx is
imported (see ``core.cpu_setup``), so each OpenBLAS setting runs in a child process
(``python -m bench.cpu --child ...``) that measures the four weight formats in turn
and prints one JSON line; the parent collects both and prints a table or one JSON object.
The model runs through mlx-lm's own ``generate_step``: what is measured is the backend.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from core import paths
from core.errors import UserError

FORMATS = ("stored", "float32", "float16", "bfloat16")
PROMPT_SENTENCE = "The quick brown fox jumps over the lazy dog while the cat sleeps by the fire. "


def run_bench_cpu(args) -> int:
    """The parent: one child per OpenBLAS setting, then the report."""
    for name in ("repeats", "prompt_tokens", "decode_tokens"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    from core.cli.progress import print_progress
    from core.models.load.loader import resolve_spec

    root = paths.data_dir(args.data_dir)
    model_path = resolve_spec(args.model, root, print_progress)  # fetch once, fail early
    children = [_run_child(openblas, model_path, root, args) for openblas in (False, True)]
    results = [r for child in children for r in child["results"]]
    report = {
        "model": args.model,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "results": results,
        "best_prefill": _best(results, "prefill_tps"),
        "best_decode": _best(results, "decode_tps"),
        "auto_choice": children[-1]["auto_choice"],
    }
    print(json.dumps(report, indent=2) if args.json else format_table(report, children))
    return 0


def _run_child(openblas: bool, model_path: Path, root: Path, args) -> dict:
    env = dict(os.environ)
    if not openblas:
        env["RADIXCHAT_OPENBLAS"] = "0"
    elif env.get("RADIXCHAT_OPENBLAS") == "0":
        del env["RADIXCHAT_OPENBLAS"]
    command = [
        sys.executable,
        "-m",
        "bench.cpu",
        "--child",
        "--model",
        str(model_path),
        "--data-dir",
        str(root),
        "--repeats",
        str(args.repeats),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--decode-tokens",
        str(args.decode_tokens),
    ]
    print(
        f"radixchat: bench cpu: OpenBLAS {'loaded' if openblas else 'not loaded'} ...",
        file=sys.stderr,
        flush=True,
    )
    proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if "error" in answer:
        raise UserError(answer["error"])
    if proc.returncode != 0 or "results" not in answer:
        raise RuntimeError(
            f"bench child exited with status {proc.returncode}: {proc.stdout[-2000:]}"
        )
    if openblas and not answer["openblas"]:
        print(
            f"radixchat: warning: OpenBLAS was not loaded: {answer['blas_reason']}", file=sys.stderr
        )
    return answer


def _best(results: list[dict], key: str) -> dict:
    best = max(results, key=lambda r: r[key])
    return {"openblas": best["openblas"], "weights": best["weights"], key: best[key]}


def _label(result: dict) -> str:
    return f"{'openblas' if result['openblas'] else 'ref-blas'} + {result['weights']}"


def format_table(report: dict, children: list[dict]) -> str:
    results = report["results"]
    fastest = {k: max(r[k] for r in results) for k in ("prefill_tps", "decode_tps")}
    base = next((r for r in results if not r["openblas"] and r["weights"] == "stored"), results[0])
    head = (
        f"{'setup':<22}{'load s':>7}{'weights MB':>11}{'prefill tok/s':>15}{'/best':>7}"
        f"{'/base':>7}{'decode tok/s':>14}{'/best':>7}{'/base':>7}"
    )
    lines = [
        f"model: {report['model']}",
        f"machine: {report['machine']['platform']}, {report['machine']['cpu_count']} CPUs",
        "",
        head,
        "-" * len(head),
    ]
    for r in results:
        lines.append(
            f"{_label(r):<22}{r['load_s']:>7.2f}{r['weight_bytes'] / 1e6:>11.1f}"
            f"{r['prefill_tps']:>15.1f}{r['prefill_tps'] / fastest['prefill_tps']:>7.2f}"
            f"{r['prefill_tps'] / base['prefill_tps']:>7.2f}{r['decode_tps']:>14.1f}"
            f"{r['decode_tps'] / fastest['decode_tps']:>7.2f}"
            f"{r['decode_tps'] / base['decode_tps']:>7.2f}"
        )
    overall = max(
        results,
        key=lambda r: (
            (r["prefill_tps"] / fastest["prefill_tps"]) * (r["decode_tps"] / fastest["decode_tps"])
        ),
    )
    blas = next((c["blas_library"] for c in children if c["blas_library"]), None)
    lines += [
        "",
        "/best: ratio to the fastest setup; /base: ratio to ref-blas + stored "
        "(the wheel's reference BLAS, weights as stored)",
        f"best prefill: {_label(report['best_prefill'])}",
        f"best decode:  {_label(report['best_decode'])}",
        f"best overall (both ratios multiplied): {_label(overall)}",
        f"`auto` picks on this machine: {report['auto_choice']} weights, "
        f"OpenBLAS {'loaded (' + blas + ')' if blas else 'not loaded'}",
    ]
    return "\n".join(lines)


# ---- the child: runs in a fresh process whose `import core` set up (or skipped) OpenBLAS


def make_prompt(tokenizer, count: int) -> list[int]:
    """Exactly ``count`` token ids: a fixed sentence repeated, tokenized, cut."""
    text = PROMPT_SENTENCE
    while True:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= count:
            return list(ids[:count])
        text += text


def measure_once(model, prompt: list[int], decode_tokens: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s): from an empty cache, then greedy decode."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=decode_tokens + 1)
    started = time.perf_counter()
    next(steps)  # the first token: the whole prompt has been computed
    first = time.perf_counter()
    decoded = sum(1 for _ in steps)
    done = time.perf_counter()
    return len(prompt) / (first - started), decoded / (done - first)


def measure_format(spec: str, root: Path, fmt: str, args) -> dict:
    import gc

    import mlx.core as mx

    from core.models.load.loader import load_model

    loaded = load_model(spec, root, fmt)
    if args.prompt_tokens + args.decode_tokens > loaded.info.context_length:
        raise UserError(
            f"--prompt-tokens + --decode-tokens exceed the model's context "
            f"({loaded.info.context_length} tokens)"
        )
    prompt = make_prompt(loaded.tokenizer, args.prompt_tokens)
    measure_once(loaded.model, prompt, args.decode_tokens)  # warm-up
    runs = [measure_once(loaded.model, prompt, args.decode_tokens) for _ in range(args.repeats)]
    prefill, decode = [r[0] for r in runs], [r[1] for r in runs]
    info = loaded.info
    del loaded
    gc.collect()
    mx.clear_cache()
    return {
        "weights": fmt,
        "prefill_tps": statistics.median(prefill),
        "decode_tps": statistics.median(decode),
        "prefill_tps_all": prefill,
        "decode_tps_all": decode,
        "load_s": info.load_seconds,
        "weight_bytes": info.weight_bytes,
    }


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu")
    parser.add_argument("--child", action="store_true", required=True)
    for name in ("--model", "--data-dir"):
        parser.add_argument(name, required=True)
    for name in ("--repeats", "--prompt-tokens", "--decode-tokens"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)
    from core.cpu_setup import blas_setup
    from core.models.load.loader import resolve_weights_format

    setup = blas_setup()
    root = Path(args.data_dir)
    try:
        results = []
        for fmt in FORMATS:
            print(f"radixchat: bench cpu:   {fmt} weights ...", file=sys.stderr, flush=True)
            results.append(
                {
                    "openblas": setup.library is not None,
                    **measure_format(args.model, root, fmt, args),
                }
            )
    except UserError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    print(
        json.dumps(
            {
                "openblas": setup.library is not None,
                "blas_library": setup.library,
                "blas_reason": setup.reason,
                "auto_choice": resolve_weights_format("auto"),
                "results": results,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
