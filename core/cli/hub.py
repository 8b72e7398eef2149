"""``radixchat search``, ``radixchat pull`` and ``radixchat models [rm]``: models from the hub."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from core import paths
from core.cli.terminal import safe
from core.errors import UserError
from core.models import derived
from core.models.hub import client, download  # models and rm import theirs when they run
from core.models.hub.fit import describe_fit, estimate_fit
from core.models.hub.search import search


def human(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return str(n)


def parameters_text(n: int | None) -> str:
    if not n:
        return "?"
    return (
        f"{n / 1e9:.1f}B"
        if n >= 1e9
        else f"{n / 1e6:.0f}M"
        if n >= 1e6
        else f"{n / 1e3:.0f}K"
        if n >= 1e3
        else str(n)
    )


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def ago(timestamp: float | None, now: float | None = None) -> str:
    if timestamp is None:
        return "never"
    seconds = max(0.0, (time.time() if now is None else now) - timestamp)
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def run_search(args) -> int:
    results = search(args.query, limit=args.limit)
    if not results:
        print(f"no MLX or GGUF models on the hub match {safe(repr(args.query))}")
        return 0
    print(
        f"{'repo':<48} {'kind':<5} {'params':>7} {'quant':<7} {'size':>9}  {'fits?':<24} "
        f"{'downloads':>10}"
    )
    for r in results:
        fit = f"no: {safe(r.problem)}" if r.problem else describe_fit(r.fit)
        gated = " (gated)" if r.gated else ""
        print(
            f"{safe(r.repo_id) + gated:<48} {r.kind:<5} {parameters_text(r.parameters):>7} "
            f"{safe(r.quantization or ''):<7} "
            f"{human(r.size_bytes):>9}  {fit:<24} {r.downloads:>10,}"
        )
    print("get one: radixchat pull REPO (a GGUF repo: REPO:FILE)", file=sys.stderr)
    return 0


class ProgressLine:
    """``pull`` progress on stderr: bytes, rate and time left; in place on a terminal,
    every 10 % otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last_tenth = -1

    def __call__(self, p: download.DownloadProgress) -> None:
        line = (
            f"radixchat: {safe(p.repo_id)}: {human(p.done_bytes)} of {human(p.total_bytes)} "
            f"{p.fraction * 100:5.1f}%  {human(p.rate)}/s  {duration(p.eta_seconds)} left"
        )
        if self.tty:
            print(f"\r{line}\033[K", end="", file=self.stream, flush=True)
        elif int(p.fraction * 10) > self.last_tenth:
            self.last_tenth = int(p.fraction * 10)
            print(line, file=self.stream, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=self.stream)


def run_pull(args) -> int:
    root = paths.data_dir(args.data_dir)
    repo_id, filename = download.parse_target(args.target)
    try:
        plan = client.plan(repo_id, filename)
    except client.ChooseFileError as exc:
        print(f"radixchat: {safe(exc)}", file=sys.stderr)
        for f in exc.choices:
            fit = estimate_fit("gguf", f.size, None)
            choice = f"{safe(repo_id)}:{safe(f.path):<40} {human(f.size):>9}"
            print(f"  {choice}  {describe_fit(fit)}", file=sys.stderr)
        return 2
    if plan.note:
        print(f"radixchat: {safe(plan.note)}", file=sys.stderr)
    have = download.partial_bytes(plan)
    print(
        f"radixchat: {safe(plan.spec)}: {len(plan.files)} files, {human(plan.size_bytes)}"
        + (f" ({human(have)} already here)" if have else "")
        + f"; {describe_fit(plan.fit)}",
        file=sys.stderr,
    )
    line = ProgressLine()
    try:
        result = download.download(plan, data_root=root, progress=line)
    finally:
        line.end()
    print(
        f"radixchat: fetched {human(result.fetched_bytes)} in {result.seconds:.2f} s; "
        f"load it with --model {safe(result.spec)}",
        file=sys.stderr,
    )
    print(safe(result.spec))
    return 0


def run_models(args) -> int:
    from core.models.base_models import is_base_model
    from core.models.hub import hf_cache, installed
    from core.models.local import list_local_models, model_file, model_path
    from core.models.pypi.known import KNOWN_MODELS

    root = paths.data_dir(args.data_dir)
    if getattr(args, "models_command", None) == "rm":
        return _remove(root, args.name, args.yes)
    if getattr(args, "models_command", None) == "clean":
        return _clean(root, args.gone)
    every = list_local_models(root)
    files = {m.spec: model_file(root, m) for m in every}
    local = [m for m in every if m.kind not in ("hf-cache", "hf-gguf")]
    present = {m.spec for m in local}
    for model in local:
        base = is_base_model(model_path(root, model) or Path(model.spec), model.name)
        print(
            f"{safe(model.spec):<48} {model.kind:<10} {model.size_bytes / 1e6:9.1f} MB  "
            f"{safe(model.name)}{_base_note(base)}{_derived_note(root, files[model.spec])}"
        )
    for name, known in KNOWN_MODELS.items():
        if name not in present:
            print(
                f"{name:<48} {'known':<10} {known.size / 1e6:9.1f} MB  not downloaded "
                f"(radixchat fetch-model {name}){_base_note(known.base)}"
            )
    models = installed.installed_models(root)
    for m in models:
        base = is_base_model(m.path, m.spec)
        print(
            f"{safe(m.spec):<48} {'hub ' + m.kind:<10} {m.size_bytes / 1e6:9.1f} MB  last used "
            f"{ago(m.last_used)}{_base_note(base)}{_derived_note(root, files.get(m.spec))}"
        )
    for p in installed.partial_downloads():
        name = safe(p.repo_id)
        print(
            f"{name:<48} {'partial':<10} {p.bytes / 1e6:9.1f} MB  unfinished: "
            f"`radixchat pull {name}` resumes, `radixchat models rm {name}` deletes"
        )
    if models:
        print(
            f"downloaded from the hub: {len(models)} model{'s' if len(models) > 1 else ''}, "
            f"{human(sum(m.size_bytes for m in models))} "
            f"in {safe(hf_cache.hf_cache_root())}"
        )
    made = derived.derived_files(root)
    if made:
        gone = derived.orphans(root, [f for f in files.values() if f is not None])
        print(
            f"made from models at load: {human(sum(f.size_bytes for f in made))} in "
            f"{safe(root)} (tokenizers, kept conversions; counted in the disk cache's budget)"
            + (
                f", {human(sum(f.size_bytes for f in gone))} of models no longer here"
                if gone
                else ""
            )
            + ": `radixchat models clean` deletes them"
        )
    return 0


def _base_note(base: bool) -> str:
    """`` · base: completion only`` for a base model (core.models.base_models)."""
    from core.models.base_models import BASE_LABEL

    return f" · {BASE_LABEL}" if base else ""


def _derived_note(root: Path, file: Path | None) -> str:
    """``  + 17.3 MB made from it (tokenizer)`` for a model with derived files."""
    made = derived.derived_of(root, file) if file is not None else []
    if not made:
        return ""
    kinds = ", ".join(sorted({f.kind for f in made}))
    return f"  + {human(sum(f.size_bytes for f in made))} made from it ({kinds})"


def _clean(root: Path, gone_only: bool) -> int:
    from core.models.local import list_local_models, model_file

    if gone_only:
        files = [model_file(root, m) for m in list_local_models(root)]
        chosen = derived.orphans(root, [f for f in files if f is not None])
    else:
        chosen = derived.derived_files(root)
    freed = derived.remove(chosen)
    print(f"deleted {len(chosen)} files made from models: {human(freed)} freed")
    return 0


def _remove(root: Path, spec: str, yes: bool) -> int:
    """Delete a model by the name ``radixchat models`` lists: the data folder's (a known
    model's name, a file or folder) or the hub's (``REPO``, ``REPO:FILE``, a partial pull)."""
    from core.models.delete import delete_from_data_folder
    from core.models.hub import installed
    from core.models.local import find_in_data_folder
    from core.models.pypi.known import KNOWN_MODELS

    local = find_in_data_folder(root, spec)
    model = installed.find(root, spec) if local is None else None
    partial = None
    if local is None and model is None:
        partial = next((p for p in installed.partial_downloads() if p.repo_id == spec), None)
    if local is None and model is None and partial is None:
        if spec in KNOWN_MODELS:
            raise UserError(f"{spec} is not downloaded: there is nothing to delete")
        raise UserError(f"no downloaded model {spec} (see `radixchat models`)")
    size = local.size_bytes if local else model.size_bytes if model else partial.bytes
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(f"deleting {spec} needs a yes: run `radixchat models rm {spec} --yes`")
        answer = input(f"Delete {safe(spec)} ({human(size)}) and its cached KV? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept")
            return 1
    if local is not None:
        deleted = delete_from_data_folder(root, local)
    else:
        deleted = installed.delete_model(root, spec)
    again = f"; `radixchat fetch-model {spec}` gets it back" if spec in KNOWN_MODELS else ""
    print(
        f"deleted {safe(spec)}: {human(deleted.freed_bytes)} of model files, "
        f"{deleted.kv_sessions} cached sessions ({human(deleted.kv_bytes)})"
        + (f", {human(deleted.derived_bytes)} made from it" if deleted.derived_bytes else "")
        + again
    )
    return 0
