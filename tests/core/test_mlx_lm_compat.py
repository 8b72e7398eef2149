"""What RadixChat takes from mlx-lm is still there, as used (core/mlx_lm_compat.py, issue 27).

Each check names the mlx-lm it ran on, what changed and what in RadixChat breaks with it,
so that a new mlx-lm release fails here, in one place, with a sentence, rather than deep
in the engine. Three kinds of check:

- every mlx-lm name imported anywhere in ``core`` or ``kvcache`` resolves (read from the
  source, so a name added anywhere is covered without being listed here);
- the boundary holds: names from mlx-lm's (or MLX's) inside are imported by the compat
  modules only;
- each internal name, field and signature the compat module relies on (the table below),
  and what each relied-on behaviour computes, on tiny models built in memory.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass

import mlx.core as mx
import pytest

from tests.test_layering import ROOT


def installed() -> str:
    wanted = [
        r
        for r in importlib.metadata.requires("radixchat") or []
        if r.startswith(("mlx-lm", "mlx_lm"))
    ]
    return (
        f"mlx-lm {importlib.metadata.version('mlx-lm')} (RadixChat pins "
        f"{', '.join(wanted) or 'nothing'})"
    )


@dataclass(frozen=True)
class Reliance:
    """One thing RadixChat relies on: ``where`` is ``module:attribute.path``."""

    where: str
    breaks: str  # what in RadixChat stops working without it
    # the signature's leading parameters, in order (self excluded)
    parameters: tuple[str, ...] | None = None
    keywords: tuple[str, ...] = ()  # parameters passed by name (anywhere in the signature)

    def resolve(self):
        module, _, path = self.where.partition(":")
        try:
            found = importlib.import_module(module)
        except ImportError as e:
            raise AssertionError(
                f"{installed()}: module {module} is gone ({e}); this breaks {self.breaks}"
            ) from e
        for part in path.split(".") if path else ():
            if not hasattr(found, part):
                raise AssertionError(
                    f"{installed()}: {self.where} is gone; this breaks {self.breaks}"
                )
            found = getattr(found, part)
        return found


DECODE = (
    "the decode batch (core/engine/decode_batch.py: requests joining a running batch, the greedy "
    "shortcut)"
)
PREFILL = "batched prefill (core/engine/batch_prefill.py)"
SPEEDUPS = "the CPU speed-ups (core/engine/cpu_speedups.py)"
TOOLS = "tool calling (core/models/load/chat_template.py, core/engine/constrain.py)"

RELIED_ON = (
    Reliance(
        "mlx_lm.generate:GenerationBatch.__init__",
        DECODE,
        (
            "model",
            "uids",
            "inputs",
            "prompt_cache",
            "tokens",
            "samplers",
            "fallback_sampler",
            "logits_processors",
            "stop_sequences",
            "max_tokens",
        ),
    ),
    Reliance("mlx_lm.generate:GenerationBatch._step", DECODE, ()),
    Reliance("mlx_lm.generate:GenerationBatch.empty", DECODE, ("model", "fallback_sampler")),
    Reliance("mlx_lm.generate:GenerationBatch.extend", DECODE, ("batch",)),
    Reliance("mlx_lm.generate:GenerationBatch.next", DECODE, ()),
    Reliance("mlx_lm.generate:GenerationBatch.filter", DECODE, ("keep",)),
    Reliance("mlx_lm.generate:GenerationBatch.extract_cache", DECODE, ("idx",)),
    Reliance("mlx_lm.generate:StopSequences", DECODE, ()),
    Reliance(
        "mlx_lm.generate:generation_stream",
        "every MLX call of the engine (it runs on mlx-lm's stream)",
    ),
    Reliance("mlx_lm.utils:maybe_set_recommended_wired_limit", DECODE, ()),
    Reliance(
        "mlx_lm.generate:PromptProcessingBatch.__init__",
        PREFILL,
        ("model", "uids", "caches"),
        ("tokens", "samplers", "logits_processors"),
    ),
    Reliance("mlx_lm.generate:PromptProcessingBatch.extract_cache", PREFILL, ("idx",)),
    Reliance("mlx_lm.generate:PromptProcessingBatch.filter", PREFILL, ("keep",)),
    Reliance("mlx_lm.models.cache:BatchKVCache.prepare", PREFILL, (), ("lengths", "right_padding")),
    Reliance("mlx_lm.models.cache:BatchKVCache.finalize", PREFILL, ()),
    Reliance("mlx_lm.tokenizer_utils:_infer_tool_parser", TOOLS, ("tokenizer",)),
    Reliance(
        "mlx_lm.tokenizer_utils:TokenizerWrapper.__init__",
        TOOLS,
        ("tokenizer", "detokenizer_class"),
        ("eos_token_ids", "tool_parser", "tool_call_start", "tool_call_end"),
    ),
    Reliance("mlx_lm.tool_parsers.json_tools:parse_tool_call", TOOLS),
    Reliance("mlx_lm.tool_parsers.json_tools:tool_call_start", TOOLS),
    Reliance("mlx_lm.tool_parsers.json_tools:tool_call_end", TOOLS),
    Reliance("mlx_lm.models.llama:Attention.__call__", SPEEDUPS, ("x", "mask", "cache")),
    Reliance("mlx_lm.models.qwen2:Attention.__call__", SPEEDUPS, ("x", "mask", "cache")),
    Reliance("mlx_lm.models.llama:MLP.__call__", SPEEDUPS, ("x",)),
    Reliance("mlx_lm.models.qwen2:MLP.__call__", SPEEDUPS, ("x",)),
    Reliance(
        "mlx_lm.models.llama:scaled_dot_product_attention",
        SPEEDUPS,
        ("queries", "keys", "values", "cache", "scale", "mask", "sinks"),
    ),
    Reliance(
        "mlx_lm.models.qwen2:scaled_dot_product_attention",
        SPEEDUPS,
        ("queries", "keys", "values", "cache", "scale", "mask", "sinks"),
    ),
    Reliance(
        "mlx_lm.utils:MODEL_REMAPPING",
        "which models a group of Macs can split (core/distributed/shard.py)",
    ),
    Reliance(
        "mlx_lm.models.pipeline:PipelineMixin",
        "pipelined groups of Macs (core/distributed/shard.py)",
    ),
)


@pytest.mark.parametrize("reliance", RELIED_ON, ids=lambda r: r.where)
def test_each_name_is_there_with_the_signature_used(reliance):
    found = reliance.resolve()
    if reliance.parameters is None and not reliance.keywords:
        return
    names = [p for p in inspect.signature(found).parameters if p != "self"]
    if reliance.parameters is not None:
        got = tuple(names[: len(reliance.parameters)])
        assert got == reliance.parameters, (
            f"{installed()}: {reliance.where} now takes ({', '.join(names)}), RadixChat passes "
            f"({', '.join(reliance.parameters)}); this breaks {reliance.breaks}"
        )
    missing = [k for k in reliance.keywords if k not in names]
    assert not missing, (
        f"{installed()}: {reliance.where} no longer takes {', '.join(missing)}; "
        f"this breaks {reliance.breaks}"
    )


@dataclass(frozen=True)
class LibraryImport:
    where: str  # path:line
    module: str  # mlx_lm.generate
    name: str | None  # the name imported from it (``from module import name``), or None


CODE = ("core", "kvcache", "bench")  # what imports mlx and mlx-lm (app never does)


def library_imports(top: tuple[str, ...] = ("mlx", "mlx_lm")) -> list[LibraryImport]:
    """Every import of ``top``'s modules and names in core, kvcache and the benchmarks
    (bench/), read from the source."""
    found = []
    for path in sorted(p for pkg in CODE for p in ROOT.joinpath(pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").split(".")[0] in top
            ):
                found += [LibraryImport(where, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [
                    LibraryImport(where, alias.name, None)
                    for alias in node.names
                    if alias.name.split(".")[0] in top
                ]
    return found


def test_every_mlx_lm_name_imported_anywhere_is_there():
    """``from mlx_lm.x import y`` anywhere in core, kvcache or bench: ``mlx_lm.x`` has ``y``."""
    used = library_imports(("mlx_lm",))
    assert len(used) > 20  # the walk saw the code
    problems = []
    for i in used:
        try:
            module = importlib.import_module(i.module)
        except ImportError:
            problems.append(f"{i.where}: module {i.module}")
            continue
        if i.name is not None and not hasattr(module, i.name) and not _submodule(i.module, i.name):
            problems.append(f"{i.where}: {i.module}.{i.name}")
    assert not problems, f"{installed()}: these names are gone:\n  " + "\n  ".join(problems)


def _submodule(package: str, name: str) -> bool:
    """``from package import name`` where ``name`` is a module of the package: there until
    imported only as a module (whether it is an attribute yet depends on what ran before)."""
    try:
        importlib.import_module(f"{package}.{name}")
    except ImportError:
        return False
    return True


# parts of mlx-lm's inside that are not private by name: only core/mlx_lm_compat.py imports them
INSIDE_MLX_LM = {
    "GenerationBatch",
    "PromptProcessingBatch",
    "StopSequences",
    "generation_stream",
    "maybe_set_recommended_wired_limit",
    "MODEL_REMAPPING",
    "PipelineMixin",
}
COMPAT_FILES = ("core/mlx_lm_compat.py", "core/mlx_compat.py")


def test_only_the_compat_modules_take_names_from_inside_mlx_lm_and_mlx():
    """A private name (``_x``, ``mlx._distributed_utils``) or a part of mlx-lm's batch engine
    imported elsewhere would be a touch of mlx-lm's or MLX's inside that this file does not
    check: it goes through core/mlx_lm_compat.py or core/mlx_compat.py."""
    offending = [
        f"{i.where}: {i.module}" + (f".{i.name}" if i.name else "")
        for i in library_imports()
        if not i.where.startswith(COMPAT_FILES)
        and (
            any(part.startswith("_") for part in i.module.split("."))
            or (i.name is not None and (i.name.startswith("_") or i.name in INSIDE_MLX_LM))
        )
    ]
    assert not offending, (
        "imports from inside mlx / mlx-lm outside the compat modules:\n  " + "\n  ".join(offending)
    )


# ---------------------------------------------------------------------- on tiny models
def _tiny(module: str, **extra):
    """A tiny mlx-lm ``Model`` of ``module`` with random weights, built in memory."""
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    config = {
        "model_type": module,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-5,
        "vocab_size": 64,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        **extra,
    }
    model = arch.Model(arch.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("module", ["llama", "qwen2"])
def test_llama_style_blocks_hold_the_fields_the_speed_ups_read(module):
    from core.mlx_lm_compat import ATTENTION_FIELDS, attention_function, llama_style_blocks

    model = _tiny(module)
    layer = model.layers[0]
    blocks = llama_style_blocks()
    assert (
        blocks.get(type(layer.self_attn)) == "attention" and blocks.get(type(layer.mlp)) == "mlp"
    ), (
        f"{installed()}: mlx_lm.models.{module} builds its layers from other classes; {SPEEDUPS} "
        "no longer apply"
    )
    missing = [f for f in ATTENTION_FIELDS if not hasattr(layer.self_attn, f)]
    assert not missing, (
        f"{installed()}: {module}.Attention lost {', '.join(missing)}; this breaks {SPEEDUPS}"
    )
    assert attention_function(type(layer.self_attn)) is not None, (
        f"{installed()}: mlx_lm.models.{module} no longer calls a module-level "
        f"scaled_dot_product_attention; {SPEEDUPS} cannot fold its attention"
    )


def test_the_attention_function_replaced_is_the_one_the_model_calls():
    """The fold works by replacing the attention function where mlx-lm's module looks it up:
    the model must call that global at run time."""
    from core.mlx_lm_compat import attention_function, replace_attention_function

    model = _tiny("llama")
    cls = type(model.layers[0].self_attn)
    original = attention_function(cls)
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    replace_attention_function(cls, counted)
    try:
        model(mx.array([[1, 2, 3]]))
    finally:
        replace_attention_function(cls, original)
    assert len(calls) == len(model.layers), (
        f"{installed()}: llama's attention no longer calls its module's "
        f"scaled_dot_product_attention at run time; {SPEEDUPS} cannot fold it"
    )


@pytest.mark.parametrize(
    "module,extra",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True}),
        ("qwen2", {}),
        ("qwen3", {}),
        ("smollm3", {}),
        (
            "gemma3_text",
            {"sliding_window": 8, "sliding_window_pattern": 2, "query_pre_attn_scalar": 8},
        ),
    ],
)
def test_models_said_to_be_head_of_backbone_are(module, extra):
    """The last-position-only vocabulary projection (core/engine/generation.py) relies on
    ``Model.__call__`` being ``head(backbone(inputs, cache))``. The same computation both
    ways, so the logits are the same bits."""
    from mlx_lm.models.cache import make_prompt_cache

    from core.mlx_lm_compat import backbone_and_head

    model = _tiny(module, **extra)
    split = backbone_and_head(model)
    assert split is not None, f"{installed()}: {module} is no longer recognised as head(backbone)"
    backbone, head = split
    tokens = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    want = model(tokens, cache=make_prompt_cache(model))
    got = head(backbone(tokens, make_prompt_cache(model)))
    assert mx.array_equal(got, want).item(), (
        f"{installed()}: {module}'s Model.__call__ is no longer head(model(inputs, cache)); this "
        "breaks the last-position logits of core/engine/generation.py (last_logits, rows_logits)"
    )


def test_a_generation_batch_keeps_the_fields_the_decode_batch_sets():
    """``GreedyBatch._step``, ``JoiningRows`` and ``row_to_park`` read and set these between
    steps."""
    from mlx_lm.generate import GenerationBatch
    from mlx_lm.sample_utils import greedy_sampler

    batch = GenerationBatch.empty(_tiny("llama"), greedy_sampler)
    fields = (
        "model",
        "uids",
        "prompt_cache",
        "tokens",
        "samplers",
        "logits_processors",
        "max_tokens",
        "_current_tokens",
        "_current_logprobs",
        "_next_tokens",
        "_next_logprobs",
        "_num_tokens",
    )
    missing = [f for f in fields if not hasattr(batch, f)]
    assert not missing, (
        f"{installed()}: GenerationBatch no longer keeps {', '.join(missing)}; this breaks {DECODE}"
    )
    response = {f.name for f in dataclasses.fields(GenerationBatch.Response)}
    lost = {"uid", "token", "finish_reason", "prompt_cache", "all_tokens"} - response
    assert not lost, (
        f"{installed()}: GenerationBatch.Response lost {', '.join(sorted(lost))}; this breaks "
        f"{DECODE}"
    )


def test_the_greedy_shortcut_and_joining_rows_give_mlx_lms_own_tokens():
    """Rows joining with their next input known, decoded with the greedy shortcut, pick the
    tokens mlx-lm's own ``GenerationBatch`` picks from the same caches (the same
    computation: the same forward on the same caches; argmax before or after normalising
    the logits is the same choice)."""
    from mlx_lm.generate import GenerationBatch, StopSequences
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import greedy_sampler

    from core.mlx_lm_compat import GreedyBatch, JoiningRows

    model = _tiny("llama")
    prompts = [[5, 6, 7, 8], [9, 10, 11]]

    def prefilled():
        caches, held = [], []
        for p in prompts:
            cache = make_prompt_cache(model)
            model(mx.array([p[:-1]]), cache=cache)
            caches.append(cache)
            held.append(p[:-1])
        merged = [type(layer).merge([c[i] for c in caches]) for i, layer in enumerate(caches[0])]
        return merged, held

    merged, held = prefilled()
    theirs = GenerationBatch(
        model,
        [0, 1],
        mx.array([p[-1] for p in prompts], dtype=mx.uint32),
        merged,
        [list(h) for h in held],
        [None, None],
        greedy_sampler,
        [[], []],
        [StopSequences(), StopSequences()],
        [6, 6],
    )
    their_tokens = [[], []]
    while len(theirs):
        for r in theirs.next():
            their_tokens[r.uid].append(r.token)
    merged, held = prefilled()
    ours = GreedyBatch.empty(model, greedy_sampler)
    ours.placeholder = mx.zeros((1,))
    # one more step each: a joining row first reports the token it joined with (which
    # GenerationBatch's own first step, in its constructor, reported and dropped)
    ours.extend(
        JoiningRows(
            model,
            [0, 1],
            [p[-1] for p in prompts],
            merged,
            held,
            [None, None],
            [[], []],
            [7, 7],
            ours.placeholder,
        )
    )
    our_tokens = [[], []]
    while len(ours):
        for r in ours.next():
            our_tokens[r.uid].append(r.token)
    assert [t[0] for t in our_tokens] == [p[-1] for p in prompts]
    assert [t[1:] for t in our_tokens] == their_tokens, (
        f"{installed()}: the decode batch's rows no longer decode as mlx-lm's GenerationBatch "
        f"does; this breaks {DECODE}"
    )


def test_the_tool_parser_table_and_the_json_parser():
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from mlx_lm.tool_parsers import json_tools
    from transformers import PreTrainedTokenizerFast

    from core.mlx_lm_compat import hf_tokenizer, infer_tool_parser, writes_json_tool_calls
    from core.models.tiny_model import build_tokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer())
    hf.chat_template = (
        "{% for m in messages %}{{ m.content }}{% for tool_call in m.tool_calls or [] %}"
        "<tool_call>{{ tool_call.name }}</tool_call>{% endfor %}{% endfor %}"
    )
    assert infer_tool_parser(hf) == "json_tools", (
        f"{installed()}: a template writing <tool_call> and tool_call.name is no longer mlx-lm's "
        f"json_tools; this breaks {TOOLS}"
    )
    assert writes_json_tool_calls(json_tools.parse_tool_call), (
        f"{installed()}: mlx-lm's JSON tool parser moved; forced tool calls ({TOOLS}) lose their "
        "grammar"
    )
    assert hf_tokenizer(TokenizerWrapper(hf)) is hf, (
        f"{installed()}: TokenizerWrapper no longer keeps the Hugging Face tokenizer as "
        f"_tokenizer; this breaks {TOOLS} and constrained decoding"
    )
