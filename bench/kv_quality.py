"""``radixchat bench kv-quality``: what quantized KV (``--kv-bits 8|4``) does to answers.

For each model (default: the default model and gemma3-270m, a hybrid sliding-window one)
and each KV format (full precision, 8-bit, 4-bit, groups of ``--group-size``), on the same
weights in the same process:

- **greedy agreement**: ``--prompts`` chat prompts (built in, each through the model's
  chat template), a greedy reply of ``--max-tokens`` tokens each (end of sequence ignored:
  every reply is that long), the 20 decoded together as one batch (mlx-lm's batch caches;
  the quantized ones :mod:`core.engine.quantized_batch`). The figure is the share of reply
  positions whose token equals full precision's, over all prompts; also given, the share
  before the first difference (a reply that drifts once differs from there on);
- **teacher-forced agreement** (a diagnostic, *not* the issue's figure): each format
  reads full precision's own replies (prompt and reply in one forward) and predicts every
  next token; the share of positions whose prediction equals full precision's on the same
  text. Free-running replies part for good at their first difference; this counts each
  position once, so it tells how often quantizing flips a prediction from how far a flip
  carries. With it, ``first_difference_margin``: full precision's own top-1 minus top-2
  logit at each reply's first free-running difference (median; small: the flip was a
  near-tie);
- **log-likelihood**: the mean log-probability per token of a fixed reference text
  (:data:`REFERENCE`), teacher-forced in chunks of :data:`CHUNK` tokens, its K/V kept in
  the format; reported as the difference from full precision (negative: the text is less
  likely with quantized KV);
- **baselines**, to tell what the quantization does from what our code does: mlx-lm's own
  ``generate_step`` on the same weights and prompts, each prompt alone, at full precision
  and with its ``QuantizedKVCache`` (``kv_bits``, ``kv_group_size``,
  ``quantized_kv_start=0``). ``mlx_lm_agreement``: mlx-lm's format against mlx-lm's full
  precision, decoded the same way (its own share of what quantizing costs);
  ``vs_mlx_lm``: our batched reply against mlx-lm's alone at the same format, whose full
  precision row is the noise floor (the same numbers along another path: a batch of 20
  left-padded rows against one row, where these small models part at near-ties).

A request's caches are built as the engine builds them (``kvcache.kv_pages``): only
full-attention caches take the format; sliding-window and recurrent layers keep theirs.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

from bench.harness import TRAVEL_NOTES, announce_repetition
from core import paths
from core.errors import UserError

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a ten-year-old.",
    "List three tips for a first visit to Rome.",
    "What is 17 times 23? Show your steps.",
    "Write a short story about a robot who learns to paint.",
    "Why is the sky blue?",
    "Give me a recipe for a simple tomato soup.",
    "What are the planets of the solar system, in order?",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Write a Python function that reverses a string.",
    "What causes the seasons on Earth?",
    "Describe a cat to someone who has never seen one.",
    "What is the difference between weather and climate?",
    "Suggest a name for a bakery and explain it.",
    "How do vaccines work?",
    "Write a polite email asking for a meeting next week.",
    "What happened in 1969 that changed space travel?",
    "Explain what a prime number is, with examples.",
    "Plan a relaxing Sunday in three steps.",
)
REFERENCE = (
    "Travel notes for a weekend in an old European city.\n"
    + "\n".join(f"- {note}" for note in TRAVEL_NOTES * 6)
    + "\nThe museum opens at nine and closes at six, except on Mondays, when it stays shut. "
    "Tickets bought online skip the queue, which in summer can take an hour. The river walk "
    "from the cathedral to the old port takes forty minutes at an easy pace; the view from "
    "the second bridge is the one on every postcard. In the evening the squares fill with "
    "people, musicians play near the fountain, and the cafes stay open until well past "
    "midnight. A good plan is to rest in the afternoon and go out again after dinner."
)
CHUNK = 256  # reference tokens fed per forward
FORMATS = (("full", None), ("8-bit", 8), ("4-bit", 4))
DEFAULT_MODELS = ("default", "gemma3-270m")
TARGET_AGREEMENT_8BIT = 0.95


def run_bench_kv_quality(args) -> int:
    if not 1 <= args.prompts <= len(PROMPTS):
        raise UserError(f"--prompts must be 1 to {len(PROMPTS)}")
    if args.max_tokens < 1:
        raise UserError("--max-tokens must be at least 1")
    from core.cli.progress import print_progress
    from core.models.load.loader import resolve_spec

    root = paths.data_dir(args.data_dir)
    models = args.models or list(DEFAULT_MODELS)
    started = time.perf_counter()
    results = []
    for i, model in enumerate(models):
        announce_repetition("kv-quality", i, len(models), f"model {model}")
        path = resolve_spec(model, root, None if args.json else print_progress).resolve()
        results.append(_measure(model, path, root, args))
        gc.collect()
    report = {
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "group_size": args.group_size,
        "wall_s": round(time.perf_counter() - started, 1),
        "models": results,
    }
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0


def _measure(name: str, path: Path, root: Path, args) -> dict:
    import mlx.core as mx

    from core.models.load.loader import load_model
    from kvcache.kv_format import KVFormat
    from kvcache.kv_pages import apply_format, formats_by_kind
    from kvcache.layout import cache_layout

    loaded = load_model(str(path), root)
    model, tokenizer = loaded.model, loaded.tokenizer
    base = cache_layout(model)
    prompts = [_chat_ids(tokenizer, text) for text in PROMPTS[: args.prompts]]
    reference = tokenizer.encode(REFERENCE)
    per_format, full_replies = {}, None
    for label, bits in FORMATS:
        layout = apply_format(model, base, KVFormat(bits, args.group_size))
        began = time.perf_counter()
        replies = _greedy_replies(model, layout, prompts, args.max_tokens)
        full_replies = full_replies or replies
        predicted, margins = teacher_forced(model, layout, prompts, full_replies)
        mlx_lm_replies = _mlx_lm_replies(model, prompts, args.max_tokens, bits, args.group_size)
        loglik = _mean_loglik(model, layout, reference)
        per_format[label] = {
            "kv_format": formats_by_kind(layout),
            "kv_bytes_per_token": layout.bytes_per_token,
            "replies": replies,
            "mlx_lm_replies": mlx_lm_replies,
            "predicted": predicted,
            "margins": margins,
            "mean_loglik": loglik,
            "seconds": round(time.perf_counter() - began, 1),
        }
        print(
            f"radixchat: bench kv-quality: {name}, {label} done "
            f"({per_format[label]['seconds']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    full = per_format["full"]
    full_mlx_lm, full_predicted, full_margins = (
        full["mlx_lm_replies"],
        full["predicted"],
        full["margins"],
    )
    out = {}
    for label, figures in per_format.items():
        replies, mlx_lm_replies = figures.pop("replies"), figures.pop("mlx_lm_replies")
        predicted = figures.pop("predicted")
        figures.pop("margins")
        same, prefix = _agreement(full_replies, replies)
        figures.update(
            greedy_agreement=same,
            prefix_agreement=prefix,
            teacher_forced_agreement=_agreement(full_predicted, predicted)[0],
            first_difference_margin=first_difference_margin(full_replies, replies, full_margins),
            mlx_lm_agreement=_agreement(full_mlx_lm, mlx_lm_replies)[0],
            vs_mlx_lm=_agreement(mlx_lm_replies, replies)[0],
            loglik_diff=figures["mean_loglik"] - full["mean_loglik"],
        )
        out[label] = figures
    del loaded, model
    mx.clear_cache()
    return {
        "model": name,
        "model_path": str(path),
        "layout": base.describe(),
        "reference_tokens": len(reference),
        "formats": out,
    }


def _chat_ids(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def _greedy_replies(model, layout, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy reply of ``max_tokens`` tokens, decoded together in one batch."""
    import mlx.core as mx

    from core.engine.quantized_batch import merge_rows
    from kvcache.kv_pages import fresh_caches

    rows, first = [], []
    for ids in prompts:
        caches = fresh_caches(model, layout)
        logits = model(mx.array(ids)[None], cache=caches)[:, -1, :]
        first.append(mx.argmax(logits, axis=-1))
        mx.eval(first[-1], [c.state for c in caches])
        rows.append(caches)
    batch = [merge_rows([row[i] for row in rows]) for i in range(len(rows[0]))]
    y = mx.concatenate(first)
    out = [y]
    for _ in range(max_tokens - 1):
        y = mx.argmax(model(y[:, None], cache=batch)[:, -1, :], axis=-1)
        mx.async_eval(y)
        out.append(y)
    return mx.stack(out, axis=1).tolist()


def teacher_forced(model, layout, prompts, replies) -> tuple[list[list[int]], list[list[float]]]:
    """Per prompt, the next token ``layout``'s format predicts at each position of
    ``replies`` (the prompt and the reply read in one forward, teacher-forced), and the
    top-1 minus top-2 logit there."""
    import mlx.core as mx

    from kvcache.kv_pages import fresh_caches

    predicted, margins = [], []
    for ids, reply in zip(prompts, replies):
        caches = fresh_caches(model, layout)
        logits = model(mx.array(ids + reply[:-1])[None], cache=caches)[0, len(ids) - 1 :]
        top2 = mx.topk(logits.astype(mx.float32), 2, axis=-1)
        margin = mx.max(top2, axis=-1) - mx.min(top2, axis=-1)
        predicted.append(mx.argmax(logits, axis=-1).tolist())
        margins.append(margin.tolist())
    return predicted, margins


def first_difference_margin(reference, other, margins) -> float | None:
    """The median of ``margins`` (full precision's top-1 minus top-2 logit per position) at
    each reply's first difference from ``reference``; None if no reply differs."""
    import statistics

    at = []
    for ref, got, margin in zip(reference, other, margins):
        first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if first is not None:
            at.append(margin[first])
    return statistics.median(at) if at else None


def _mlx_lm_replies(
    model, prompts: list[list[int]], max_tokens: int, bits: int | None, group_size: int
) -> list[list[int]]:
    """Each prompt's greedy reply from mlx-lm's own generation (:func:`mlx_lm_steps`), alone."""
    out = []
    for ids in prompts:
        steps = mlx_lm_steps(model, ids, max_tokens, bits, group_size)
        out.append([int(token) for token, _ in steps])
    return out


def mlx_lm_steps(model, ids: list[int], max_tokens: int, bits: int | None, group_size: int):
    """mlx-lm's ``generate_step`` (greedy) over ``ids``. With ``bits``, its ``kv_bits``
    (``quantized_kv_start=0``: the prompt but its last token is computed at full precision,
    then every ``KVCache`` becomes a ``QuantizedKVCache``); a model with sliding-window
    caches, which mlx-lm's ``kv_bits`` refuses, gets ``QuantizedKVCache`` for its
    full-attention layers from the first token instead (as ours)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

    caches, options = make_prompt_cache(model), {}
    if bits and all(type(c) is KVCache for c in caches):
        options = {"kv_bits": bits, "kv_group_size": group_size, "quantized_kv_start": 0}
    elif bits:
        caches = [QuantizedKVCache(group_size, bits) if type(c) is KVCache else c for c in caches]
    return generate_step(
        mx.array(ids), model, max_tokens=max_tokens, prompt_cache=caches, **options
    )


def _mean_loglik(model, layout, ids: list[int]) -> float:
    """Mean log-probability of ``ids[1:]`` given what precedes each, K/V in ``layout``'s format."""
    import mlx.core as mx

    from kvcache.kv_pages import fresh_caches

    caches, total = fresh_caches(model, layout), 0.0
    for start in range(0, len(ids) - 1, CHUNK):
        chunk = ids[start : start + CHUNK]
        targets = ids[start + 1 : start + 1 + len(chunk)]
        logits = model(mx.array(chunk)[None], cache=caches)[0, : len(targets)].astype(mx.float32)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picked = mx.take_along_axis(logp, mx.array(targets)[:, None], axis=-1)
        total += mx.sum(picked).item()
    return total / (len(ids) - 1)


def _agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[float, float]:
    """(share of positions with the same token, share of tokens before the first difference)."""
    positions = sum(len(r) for r in reference)
    same = sum(a == b for ref, got in zip(reference, other) for a, b in zip(ref, got))
    prefix = 0
    for ref, got in zip(reference, other):
        n = 0
        while n < len(ref) and ref[n] == got[n]:
            n += 1
        prefix += n
    return same / positions, prefix / positions


def _logit(margin: float | None) -> str:
    return "-" if margin is None else f"{margin:.3f}"


def format_summary(report: dict) -> str:
    lines = [
        f"{report['prompts']} prompts x {report['max_tokens']} greedy tokens, reference text "
        f"log-likelihood; KV groups of {report['group_size']} ({report['wall_s']:.0f} s)"
    ]
    for result in report["models"]:
        lines.append(f"model: {result['model']} ({result['model_path']})")
        lines.append(f"  {result['layout']}")
        for label, f in result["formats"].items():
            kinds = "; ".join(f"{k}: {v}" for k, v in f["kv_format"].items())
            line = (
                f"  {label:6} agreement {f['greedy_agreement']:6.1%} (before the first "
                f"difference {f['prefix_agreement']:6.1%}; mlx-lm's own "
                f"{f['mlx_lm_agreement']:6.1%}; vs mlx-lm alone at this format "
                f"{f['vs_mlx_lm']:6.1%}; teacher-forced, a diagnostic: "
                f"{f['teacher_forced_agreement']:6.1%}; full precision's top-1 lead at the "
                f"first difference {_logit(f['first_difference_margin'])}), log-likelihood "
                f"{f['mean_loglik']:.4f} ({f['loglik_diff']:+.4f}), "
                f"{f['kv_bytes_per_token']:,} KV bytes/token [{kinds}]"
            )
            if label == "8-bit":
                met = f["greedy_agreement"] >= TARGET_AGREEMENT_8BIT
                line += f" target >= 95%: {'met' if met else 'MISSED'}"
            lines.append(line)
    return "\n".join(lines)
