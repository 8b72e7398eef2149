"""``radixchat bench NAME``: the benchmarks (core/cli/bench/, the app's in app/bench_gui.py).
Listed apart from the user's commands in ``radixchat --help``."""

from __future__ import annotations

import argparse

from core.cli.commands.options import JSON_HELP, MODEL_HELP, REPEATS_HELP, add_data_dir, positive

NAME = "bench"
SUMMARY = (
    "benchmarks (radixchat bench --help lists them)"  # radixchat --help's line, "for developers"
)


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser(
        NAME,
        description="The benchmarks: each prints its figures (one JSON object "
        "with --json); docs/benchmarks.md has what they measured.",
    )
    # (no help=: argparse does not list it among the user's commands; core.cli.main lists it apart)
    benches = bench.add_subparsers(dest="bench_command", required=True)
    for add in (
        _hostile,
        _cpu,
        _multiturn,
        _restore,
        _pressure,
        _distributed,
        _serve,
        _agent,
        _followup,
        _clients,
        _constrain,
        _fairness,
        _key_fairness,
        _pull,
        _switch,
        _kv_quality,
        _kv_capacity,
        _speculative,
        _llamacpp,
        _soak,
        _gui,
    ):
        add(benches)


def _with_model(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_data_dir(parser)
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    return parser


def _kv_quality(benches) -> None:
    quality = benches.add_parser(
        "kv-quality",
        help="quantized KV (8-bit, 4-bit) against full precision: greedy agreement and the "
        "log-likelihood of a reference text (target: 8-bit agrees on >= 95%% of tokens)",
    )
    add_data_dir(quality)
    quality.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        help="models to measure, each a known name, .gguf file, MLX folder or HF repo id "
        "(default: default gemma3-270m)",
    )
    quality.add_argument(
        "--prompts", type=positive, default=20, help="chat prompts (default: %(default)s)"
    )
    quality.add_argument(
        "--max-tokens", type=positive, default=256, help="greedy reply length (default: 256)"
    )
    quality.add_argument(
        "--group-size", type=int, choices=(32, 64, 128), default=64, help="KV quantization group"
    )
    quality.add_argument("--json", action="store_true", help=JSON_HELP)
    quality.set_defaults(run=run_kv_quality)


def run_kv_quality(args: argparse.Namespace) -> int:
    from core.cli.bench.kv_quality import run_bench_kv_quality

    return run_bench_kv_quality(args)


def _kv_capacity(benches) -> None:
    capacity = _with_model(
        benches.add_parser(
            "kv-capacity",
            help="quantized KV against full precision in one run: tokens the pool holds in "
            "one RAM budget, disk bytes per token, restore after a restart, decode tok/s",
        )
    )
    capacity.add_argument(
        "--tokens", type=positive, default=1024, help="the session's length (default: 1024)"
    )
    capacity.add_argument(
        "--budget-mb", type=positive, default=256, help="the pool's RAM budget (default: 256)"
    )
    capacity.add_argument(
        "--decode-tokens", type=positive, default=128, help="tokens decoded (default: 128)"
    )
    capacity.add_argument(
        "--group-size", type=int, choices=(32, 64, 128), default=64, help="KV quantization group"
    )
    capacity.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)
    capacity.add_argument("--json", action="store_true", help=JSON_HELP)
    capacity.set_defaults(run=run_kv_capacity)


def run_kv_capacity(args: argparse.Namespace) -> int:
    from core.cli.bench.kv_capacity import run_bench_kv_capacity

    return run_bench_kv_capacity(args)


def _hostile(benches) -> None:
    hostile = _with_model(
        benches.add_parser(
            "hostile",
            help="what a flood of connections, a client that never reads and a "
            "huge body cost another client (target: answers within 2 s)",
        )
    )
    hostile.add_argument(
        "--scenes",
        nargs="+",
        choices=("quiet", "flood", "greedy", "tools"),
        help="default: all (quiet: nobody attacking, the reference)",
    )
    hostile.add_argument(
        "--connections", type=positive, default=2100, help="flood: half-sent request heads held"
    )
    hostile.add_argument(
        "--streams", type=positive, default=16, help="greedy: key A's streams that are never read"
    )
    hostile.add_argument(
        "--long-tokens", type=positive, default=2000, help="greedy: each stream's max_tokens"
    )
    hostile.add_argument(
        "--tools", type=positive, default=30_000, help="tools: tools in each of key A's bodies"
    )
    hostile.add_argument(
        "--probes", type=positive, default=5, help="the other client's requests per scene"
    )
    hostile.add_argument(
        "--kv-tokens", type=positive, default=32768, help="the server's KV pool, in tokens"
    )
    hostile.add_argument("--json", action="store_true", help=JSON_HELP)
    hostile.set_defaults(run=run_hostile)


def run_hostile(args: argparse.Namespace) -> int:
    from core.cli.bench.hostile import run_bench_hostile

    return run_bench_hostile(args)


def _cpu(benches) -> None:
    cpu = _with_model(
        benches.add_parser("cpu", help="CPU backend setups: OpenBLAS and weight formats")
    )
    cpu.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    cpu.add_argument(
        "--prompt-tokens", type=int, default=256, help="prompt length (default: %(default)s)"
    )
    cpu.add_argument(
        "--decode-tokens",
        type=int,
        default=32,
        help="tokens decoded after it (default: %(default)s)",
    )
    cpu.add_argument("--json", action="store_true", help=JSON_HELP)
    cpu.set_defaults(run=run_cpu)


def run_cpu(args: argparse.Namespace) -> int:
    from core.cli.bench.cpu import run_bench_cpu

    return run_bench_cpu(args)


def _multiturn(benches) -> None:
    multiturn = _with_model(
        benches.add_parser("multiturn", help="a greedy N-turn chat: cached vs uncached vs mlx-lm")
    )
    multiturn.add_argument(
        "--turns", type=int, default=8, help="turns of the chat (default: %(default)s)"
    )
    multiturn.add_argument("--max-tokens", type=int, default=48, help="reply length per turn")
    multiturn.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    multiturn.add_argument("--page-size", type=int, help="tokens per KV page")
    multiturn.add_argument(
        "--segment-mb",
        type=float,
        help="the KV pool grows by this many MiB at a time (0: all at once; default 32)",
    )
    multiturn.add_argument("--json", action="store_true", help=JSON_HELP)
    multiturn.set_defaults(run=run_multiturn)


def run_multiturn(args: argparse.Namespace) -> int:
    from core.cli.bench.multiturn import run_bench_multiturn

    return run_bench_multiturn(args)


def _restore(benches) -> None:
    restore = _with_model(
        benches.add_parser("restore", help="TTFT after a restart: restored vs recomputed vs RAM")
    )
    restore.add_argument("--tokens", type=int, default=2000, help="length of the session's history")
    restore.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    restore.add_argument(
        "--api",
        action="store_true",
        help="an unnamed API client's prompt (disk tier by tokens) instead of a chat session",
    )
    restore.add_argument("--json", action="store_true", help=JSON_HELP)
    restore.set_defaults(run=run_restore)


def run_restore(args: argparse.Namespace) -> int:
    if args.api:
        from core.cli.bench.restore_api import run_bench_restore_api

        return run_bench_restore_api(args)
    from core.cli.bench.restore import run_bench_restore

    return run_bench_restore(args)


def _pressure(benches) -> None:
    pressure = _with_model(
        benches.add_parser(
            "pressure", help="a pool a quarter of the working set: disk tier vs RAM only"
        )
    )
    pressure.add_argument(
        "--clients", type=int, default=16, help="clients cycling through their prompts"
    )
    pressure.add_argument("--tokens", type=int, default=1000, help="each client's prompt length")
    pressure.add_argument(
        "--rounds", type=int, default=3, help="times each client sends its prompt"
    )
    pressure.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    pressure.add_argument("--json", action="store_true", help=JSON_HELP)
    pressure.set_defaults(run=run_pressure)


def run_pressure(args: argparse.Namespace) -> int:
    from core.cli.bench.pressure import run_bench_pressure

    return run_bench_pressure(args)


def _distributed(benches) -> None:
    distributed = benches.add_parser(
        "distributed",
        help="the same greedy chat on 1 process and split over 2 "
        "ranks on loopback: TTFT and decode, cached and not",
    )
    add_data_dir(distributed)
    distributed.add_argument(
        "--model", help="a model that splits over 2 (default: a generated llama)"
    )
    distributed.add_argument(
        "--prompt-tokens", default="128,1024", help="prompt lengths, comma separated"
    )
    distributed.add_argument("--max-tokens", type=int, default=32, help="reply length")
    distributed.add_argument(
        "--kv-tokens", type=int, default=16384, help="KV pool of each server, in tokens"
    )
    distributed.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    distributed.add_argument(
        "--split",
        choices=("tensor", "pipeline"),
        default="tensor",
        help="how the 2 ranks split the model (pipeline: the default model is a qwen2)",
    )
    distributed.add_argument("--json", action="store_true", help=JSON_HELP)
    distributed.set_defaults(run=run_distributed)


def run_distributed(args: argparse.Namespace) -> int:
    from core.cli.bench.distributed import run_bench_distributed

    return run_bench_distributed(args)


def _serve(benches) -> None:
    serve = _with_model(
        benches.add_parser(
            "serve",
            help="API decode throughput: N concurrent streaming clients "
            "vs one (--against mlx-lm: and vs mlx_lm.server)",
        )
    )
    serve.add_argument(
        "--streams",
        type=int,
        nargs="+",
        metavar="N",
        help="concurrent clients, besides one (default: 4; 4 8 with --against)",
    )
    serve.add_argument(
        "--against",
        choices=("mlx-lm",),
        help="also mlx_lm.server on the same weights; both servers as subprocesses, "
        "interleaved run by run",
    )
    serve.add_argument("--max-tokens", type=int, default=64, help="reply length per request")
    serve.add_argument("--repeats", type=int, default=3, help="repetitions (medians are reported)")
    serve.add_argument("--json", action="store_true", help=JSON_HELP)
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    if args.against:
        from core.cli.bench.serve_against import run_bench_serve_against

        return run_bench_serve_against(args)
    from core.cli.bench.serve import run_bench_serve

    return run_bench_serve(args)


def _agent(benches) -> None:
    agent = _with_model(
        benches.add_parser(
            "agent",
            help="a coding-agent session with tools: TTFT, ours vs "
            "ours without cache vs mlx_lm.server",
        )
    )
    agent.add_argument("--max-tokens", type=int, default=16, help="reply length per request")
    agent.add_argument("--repeats", type=int, default=1, help="repetitions (medians are reported)")
    agent.add_argument("--rounds", type=int, default=10, help="tool rounds per agent")
    agent.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template that takes tools (for models whose own does not)",
    )
    agent.add_argument(
        "--endpoint",
        choices=("messages", "chat"),
        default="messages",
        help="drive our server through /v1/messages (Anthropic) or /v1/chat/completions "
        "(mlx_lm.server always gets /v1/chat/completions)",
    )
    agent.add_argument(
        "--nocache-every",
        type=int,
        default=1,
        metavar="K",
        help="our server without cache runs only every K-th request (the ratio is taken "
        "over those; 1: all of them)",
    )
    agent.add_argument(
        "--skip-nocache", action="store_true", help="leave out our server without cache"
    )
    agent.add_argument("--json", action="store_true", help=JSON_HELP)
    agent.set_defaults(run=run_agent)


def run_agent(args: argparse.Namespace) -> int:
    from core.cli.bench.agent import run_bench_agent

    return run_bench_agent(args)


def _followup(benches) -> None:
    followup = _with_model(
        benches.add_parser(
            "followup",
            help="a follow-up's new tokens on a cached prefix: TTFT, ours vs mlx_lm.server",
        )
    )
    followup.add_argument(
        "--prefix-tokens",
        type=positive,
        nargs="+",
        default=[1500, 2000, 2500],
        metavar="N",
        help="cached prefix sizes, tokens (default: 1500 2000 2500)",
    )
    followup.add_argument(
        "--new-tokens",
        type=positive,
        nargs="+",
        default=[150, 250],
        metavar="N",
        help="new tokens in each follow-up (default: 150 250)",
    )
    followup.add_argument(
        "--max-tokens", type=positive, default=4, help="reply length of a follow-up"
    )
    followup.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)
    followup.add_argument("--json", action="store_true", help=JSON_HELP)
    followup.set_defaults(run=run_followup)


def run_followup(args: argparse.Namespace) -> int:
    from core.cli.bench.followup import run_bench_followup

    return run_bench_followup(args)


# the small task bench clients gives each coding agent
CLIENTS_TASK = "Create a file named hello.txt that contains the word hi."


def _clients(benches) -> None:
    clients = _with_model(
        benches.add_parser(
            "clients",
            help="Claude Code and Codex, as installed, against our server: per request its "
            "dialect, prompt and cached tokens, TTFT; and whether each finished",
        )
    )
    # an instruct model with tools and a 32k context (gemma3-270m, a base model, never ends a turn)
    clients.set_defaults(model="qwen2.5-coder-0.5b")
    clients.add_argument("--claude", metavar="PATH", help="Claude Code (default: claude on PATH)")
    clients.add_argument("--codex", metavar="PATH", help="Codex (default: codex on PATH)")
    clients.add_argument("--task", default=CLIENTS_TASK, help="what each client is asked to do")
    clients.add_argument(
        "--max-turns", type=positive, default=3, help="Claude Code's --max-turns (default: 3)"
    )
    clients.add_argument(
        "--timeout-s", type=positive, default=3600, help="the longest one client may run"
    )
    clients.add_argument(
        "--max-output-tokens",
        type=positive,
        default=512,
        metavar="N",
        help="a reply's tokens: the server's ceiling (Codex sets no limit) and Claude Code's "
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS (default: 512; a model that does not end its turn "
        "would have a CPU decode the context's rest for an hour)",
    )
    clients.add_argument("--kv-tokens", type=positive, help="the server's KV pool, in tokens")
    clients.add_argument(
        "--no-mlx-lm",
        action="store_true",
        help="skip asking mlx_lm.server (it serves neither client's endpoint)",
    )
    clients.add_argument("--json", action="store_true", help=JSON_HELP)
    clients.set_defaults(run=run_clients)


def run_clients(args: argparse.Namespace) -> int:
    from core.cli.bench.clients import run_bench_clients

    return run_bench_clients(args)


def _constrain(benches) -> None:
    constrain = _with_model(
        benches.add_parser("constrain", help="what constrained decoding costs per token")
    )
    constrain.add_argument("--max-tokens", type=int, default=48, help="reply length per request")
    constrain.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    constrain.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template that takes tools "
        "(for models whose own does not: the tool_required mode needs one)",
    )
    constrain.add_argument("--json", action="store_true", help=JSON_HELP)
    constrain.set_defaults(run=run_constrain)


def run_constrain(args: argparse.Namespace) -> int:
    from core.cli.bench.constrain import run_bench_constrain

    return run_bench_constrain(args)


def _fairness(benches) -> None:
    fairness = _with_model(
        benches.add_parser(
            "fairness",
            help="a stream's inter-token gaps while another client's long prompt is prefilled",
        )
    )
    fairness.add_argument(
        "--long-tokens", type=int, default=3000, help="the long prompt's length, tokens"
    )
    fairness.add_argument(
        "--max-tokens", type=int, default=64, help="the stream's reply alone, tokens"
    )
    fairness.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    fairness.add_argument("--json", action="store_true", help=JSON_HELP)
    fairness.set_defaults(run=run_fairness)


def run_fairness(args: argparse.Namespace) -> int:
    from core.cli.bench.fairness import run_bench_fairness

    return run_bench_fairness(args)


def _key_fairness(benches) -> None:
    fairness = _with_model(
        benches.add_parser(
            "key-fairness",
            help="another API key's short chat behind one key's long prompts: its time to "
            "first token, prefill shared between keys and as before",
        )
    )
    fairness.add_argument(
        "--long-tokens", type=int, default=6000, help="key A's one long prompt, tokens"
    )
    fairness.add_argument("--queue", type=int, default=3, help="key A's queue: prompts")
    fairness.add_argument(
        "--queue-tokens", type=int, default=1650, help="key A's queue: each prompt, tokens"
    )
    fairness.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    fairness.add_argument("--json", action="store_true", help=JSON_HELP)
    fairness.set_defaults(run=run_key_fairness)


def run_key_fairness(args: argparse.Namespace) -> int:
    from core.cli.bench.key_fairness import run_bench_key_fairness

    return run_bench_key_fairness(args)


def _pull(benches) -> None:
    pull = benches.add_parser(
        "pull", help="`radixchat pull` from a loopback hub vs curl (source checkout)"
    )
    pull.add_argument("--mb", type=int, default=500, help="size of the weights file, MiB")
    pull.add_argument("--repeats", type=int, default=3, help="repetitions (medians are reported)")
    pull.add_argument("--json", action="store_true", help=JSON_HELP)
    pull.set_defaults(run=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    from core.cli.bench.pull import run_bench_pull

    return run_bench_pull(args)


def _switch(benches) -> None:
    switch = benches.add_parser(
        "switch",
        help="RSS and MLX memory after switching models, against a fresh start (target: 10 %%)",
    )
    add_data_dir(switch)
    switch.add_argument(
        "--models",
        nargs=2,
        default=["default", "gemma3-270m"],
        metavar="MODEL",
        help="the two models switched between (default: default gemma3-270m)",
    )
    switch.add_argument("--switches", type=positive, default=5, help="model loads after the first")
    switch.add_argument("--pool-mb", type=positive, default=64, help="the KV pool, MiB")
    switch.add_argument("--json", action="store_true", help=JSON_HELP)
    switch.set_defaults(run=run_switch)


def run_switch(args: argparse.Namespace) -> int:
    from core.cli.bench.switch import run_bench_switch

    return run_bench_switch(args)


def _speculative(benches) -> None:
    speculative = _with_model(
        benches.add_parser(
            "speculative",
            help="decode speed with speculation (drafts from the prompt and the cache) vs "
            "without and vs mlx_lm.server: a file rewritten, JSON reformatted, a chat, four "
            "at once (targets: 2.0x mlx_lm.server, 1.8x without, 0.97x, 1.5x)",
        )
    )
    speculative.add_argument(
        "--cases",
        nargs="+",
        choices=("rewrite", "json", "chat", "four"),
        help="default: all",
    )
    speculative.add_argument(
        "--max-tokens", type=positive, default=200, help="reply length (default: %(default)s)"
    )
    speculative.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)
    speculative.add_argument("--json", action="store_true", help=JSON_HELP)
    speculative.set_defaults(run=run_speculative)


def run_speculative(args: argparse.Namespace) -> int:
    from core.cli.bench.speculative import run_bench_speculative

    return run_bench_speculative(args)


def _llamacpp(benches) -> None:
    llamacpp = _with_model(
        benches.add_parser(
            "llamacpp",
            help="a GGUF's greedy replies from RadixChat and from llama.cpp (llama-cpp-python) "
            "on the same prompt token ids",
        )
    )
    llamacpp.add_argument("--prompts", type=positive, default=5, help="prompts (at most 5)")
    llamacpp.add_argument(
        "--max-tokens", type=positive, default=32, help="reply length (default: %(default)s)"
    )
    llamacpp.add_argument("--threads", type=positive, default=2, help="llama.cpp's threads")
    llamacpp.add_argument("--json", action="store_true", help=JSON_HELP)
    llamacpp.set_defaults(run=run_llamacpp)


def run_llamacpp(args: argparse.Namespace) -> int:
    from core import paths
    from core.cli.bench.llamacpp import run

    data_root = paths.data_dir(args.data_dir)
    return run(args.model, data_root, args.prompts, args.max_tokens, args.json, args.threads)


def _soak(benches) -> None:
    soak = _with_model(
        benches.add_parser(
            "soak",
            help="8 clients of the three dialects for N minutes, a restart half way: RSS, "
            "open files, each store's disk use, errors, replies against --no-cache (targets: "
            "RSS flat within 5%%, stores within budget, no 5xx, no mismatch)",
        )
    )
    for flag, kind, default, what in (
        ("--minutes", float, 60, "how long the clients run"),
        ("--disk-budget-mb", float, 64, "the server's --disk-budget, MB: small, so stores evict"),
        ("--kv-tokens", positive, 8192, "the server's KV pool, tokens"),
        ("--max-tokens", positive, 32, "a reply's tokens"),
        ("--mirror-share", float, 0.25, "greedy conversations also sent to --no-cache"),
        ("--sample-s", float, 15, "seconds between samples"),
        ("--request-timeout-s", float, 300, "every request's timeout, seconds"),
    ):
        soak.add_argument(flag, type=kind, default=default, help=f"{what} (default: {default:g})")
    soak.add_argument("--json", action="store_true", help=JSON_HELP)
    soak.set_defaults(run=run_soak)


def run_soak(args: argparse.Namespace) -> int:
    from core.cli.bench.soak import run_bench_soak

    return run_bench_soak(args)


def _gui(benches) -> None:
    gui = _with_model(
        benches.add_parser("gui", help="the app's event-loop latency while a reply streams")
    )
    gui.add_argument("--max-tokens", type=int, default=128, help="reply length")
    gui.add_argument(
        "--repeats", type=int, default=3, help="replies measured (medians are reported)"
    )
    gui.add_argument("--json", action="store_true", help=JSON_HELP)
    # the app runs it (app/bench_gui.py): core.cli.main hands it to the app
    gui.set_defaults(run=None)
