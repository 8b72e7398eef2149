"""``radixchat bench switch``: memory after switching models, against a fresh start.

One engine starts on the first model and switches between the two ``--switches`` times,
answering one short prompt after each load; after each, the process's RSS and MLX's active
memory are read. Then a new process starts on the model the switches ended on, answers the
same prompt, and is read the same way: after any number of switches, memory should be what
one load of the current model takes (within 10 %). Each run uses a scratch data folder with
the models linked in, and a fixed KV pool (``--pool-mb``), so the pools compare.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import link_models, scratch_data_folder
from core import paths
from core.engine.config import EngineConfig
from core.errors import UserError

PROMPT = "Say hello."


@dataclass(frozen=True)
class MemoryReading:
    step: str
    model: str
    rss_mb: float
    mlx_active_mb: float


def read_memory(engine, step: str) -> MemoryReading:
    from core.engine.types import ChatMessage, GenerationRequest, SamplingParams

    request = GenerationRequest(
        messages=(ChatMessage("user", PROMPT),),
        sampling=SamplingParams(temperature=0.0, max_tokens=8),
        use_cache=False,
    )
    list(engine.stream(request))
    stats = engine.stats()
    return MemoryReading(
        step,
        stats.model.name if stats.model else "",
        round(stats.rss_bytes / paths.MB, 1),
        round(stats.mlx_active_bytes / paths.MB, 1),
    )


def switch_in_process(data: Path, models: list[str], switches: int, pool_mb: int) -> list:
    from core.engine.engine import Engine

    engine = Engine(data, models[0], config=EngineConfig(pool_bytes=pool_mb * paths.MB)).start()
    try:
        engine.wait_ready()
        readings = [read_memory(engine, "start")]
        for i in range(switches):
            engine.load(models[(i + 1) % len(models)])
            readings.append(read_memory(engine, f"switch {i + 1}"))
    finally:
        engine.shutdown()
    return readings


def fresh_start(data: Path, spec: str, pool_mb: int) -> MemoryReading:
    """The same reading in a new process started on ``spec``."""
    code = (
        "import json, sys; from pathlib import Path; from dataclasses import asdict; "
        "from core.engine.engine import Engine; from bench.switch import read_memory; "
        "from core.engine.config import EngineConfig; "
        "config = EngineConfig(pool_bytes=int(sys.argv[3])); "
        "e = Engine(Path(sys.argv[1]), sys.argv[2], config=config).start(); "
        "e.wait_ready(); print(json.dumps(asdict(read_memory(e, 'fresh start')))); e.shutdown()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(data), spec, str(pool_mb * paths.MB)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise UserError(f"the fresh start on {spec} failed: {done.stderr.strip()[-300:]}")
    return MemoryReading(**json.loads(done.stdout.strip().splitlines()[-1]))


def run_bench_switch(args) -> int:
    root = paths.data_dir(args.data_dir)
    models = list(args.models)
    with scratch_data_folder(root, "switch") as data:
        link_models(root, data)
        readings = switch_in_process(data, models, args.switches, args.pool_mb)
        fresh = fresh_start(data, models[args.switches % len(models)], args.pool_mb)
    last = readings[-1]
    over = {
        "rss": last.rss_mb / fresh.rss_mb - 1 if fresh.rss_mb else 0.0,
        "mlx_active": last.mlx_active_mb / fresh.mlx_active_mb - 1 if fresh.mlx_active_mb else 0.0,
    }
    if args.json:
        print(
            json.dumps(
                {
                    "readings": [asdict(r) for r in readings],
                    "fresh": asdict(fresh),
                    "over_fresh": over,
                }
            )
        )
        return 0
    for r in [*readings, fresh]:
        print(
            f"{r.step:<12} {r.model:<32} RSS {r.rss_mb:8.1f} MB   "
            f"MLX active {r.mlx_active_mb:8.1f} MB"
        )
    print(
        f"after {args.switches} switches: RSS {over['rss']:+.1%}, MLX active "
        f"{over['mlx_active']:+.1%} against a fresh start on {fresh.model}"
    )
    return 0
