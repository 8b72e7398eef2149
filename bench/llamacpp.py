"""``radixchat bench llamacpp``: a GGUF's greedy replies from RadixChat and from llama.cpp.

The check that a GGUF import is the model llama.cpp runs: the same file, the same prompt
token ids (the file's chat template rendered by RadixChat's tokenizer, and llama.cpp's own
tokenisation of that text compared with them), greedy replies of ``--max-tokens`` tokens
from RadixChat's engine and from llama.cpp (``llama-cpp-python``, built on the machine: not
a dependency of RadixChat; ``pip install llama-cpp-python``). Reported per prompt: both
replies, whether their first 10 characters agree (the issue's measure), and where the
token ids first differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.harness import ask_greedy
from core.errors import UserError

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a prime number is, with examples.",
    "Write a haiku about the sea.",
    "What is 17 times 23?",
)
AGREE_CHARS = 10  # replies agree when their first 10 characters do


def run_bench_llamacpp(args) -> int:
    """``radixchat bench llamacpp`` with its parsed arguments."""
    from core import paths

    data_root = paths.data_dir(args.data_dir)
    return run(args.model, data_root, args.prompts, args.max_tokens, args.json, args.threads)


def run(
    spec: str, data_root: Path, prompts: int, max_tokens: int, as_json: bool, threads: int
) -> int:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise UserError(
            "bench llamacpp needs llama-cpp-python: pip install llama-cpp-python"
        ) from None
    from core.engine.engine import Engine
    from core.engine.types import ChatMessage
    from core.models.load.gguf_header import read_header
    from core.models.load.gguf_import import build_tokenizer
    from core.models.load.loader import resolve_spec

    path = resolve_spec(spec, data_root)
    if path.suffix.lower() != ".gguf":
        raise UserError(f"{path} is not a .gguf file: llama.cpp runs GGUF files only")
    tokenizer = build_tokenizer(read_header(path).metadata)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS[:prompts]]
    theirs = _llama_cpp_replies(Llama, path, tokenizer, chats, max_tokens, threads)
    engine = Engine(data_root, str(path)).start()
    engine.wait_ready()
    try:
        ours = [
            ask_greedy(
                engine,
                [ChatMessage(m["role"], m["content"]) for m in chat],
                "llamacpp",
                use_cache=False,
                max_tokens=max_tokens,
            ).text
            for chat in chats
        ]
    finally:
        engine.shutdown()
    rows = [
        {
            "prompt": chat[0]["content"],
            "radixchat": mine,
            "llama_cpp": other["text"],
            "same_tokenization": other["same_tokenization"],
            "agree_first_10": mine[:AGREE_CHARS] == other["text"][:AGREE_CHARS],
            "identical": mine == other["text"],
        }
        for chat, mine, other in zip(chats, ours, theirs)
    ]
    result = {
        "model": str(path),
        "max_tokens": max_tokens,
        "agree_first_10": sum(r["agree_first_10"] for r in rows),
        "identical": sum(r["identical"] for r in rows),
        "prompts": rows,
    }
    if as_json:
        json.dump(result, sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        for row in rows:
            mark = "same" if row["identical"] else ("agree" if row["agree_first_10"] else "DIFFER")
            print(f"[{mark}] {row['prompt']}")
            print(f"  radixchat: {row['radixchat']!r}")
            print(f"  llama.cpp: {row['llama_cpp']!r}")
        print(
            f"first {AGREE_CHARS} characters agree on {result['agree_first_10']} of {len(rows)}; "
            f"identical replies: {result['identical']} of {len(rows)}"
        )
    return 0


def _llama_cpp_replies(llama_cls, path: Path, tokenizer, chats, max_tokens: int, threads: int):
    """llama.cpp's greedy reply to each chat, from the same prompt token ids as ours."""
    llm = llama_cls(model_path=str(path), n_ctx=4096, n_threads=threads, verbose=False)
    eos = set(tokenizer.eos_token_ids) | {llm.token_eos()}
    replies = []
    for chat in chats:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        text = tokenizer.decode(ids)
        theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        out: list[int] = []
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
            if token in eos or len(out) == max_tokens:
                break
            out.append(token)
        replies.append(
            {"text": tokenizer.decode(out), "same_tokenization": list(theirs) == list(ids)}
        )
    return replies
