"""What RadixChat takes from inside mlx-lm, in one place (issue 27).

RadixChat uses mlx-lm's public API where it can: ``mlx_lm.load`` / ``mlx_lm.utils``'s
load and save functions, ``stream_generate``, ``generate_step`` and ``BatchGenerator``,
``mlx_lm.sample_utils``, the cache classes of ``mlx_lm.models.cache`` with their
``state`` / ``from_state`` / ``merge`` / ``extract`` / ``filter`` (all that ``kvcache``
uses), ``TokenizerWrapper`` and the tool parsers' modules. Everything it takes from
further inside comes through this module, and only through it:

- the parts ``BatchGenerator`` is built from: ``GenerationBatch`` (the decode batch
  overrides its ``_step`` and sets the fields it keeps between steps: see
  :class:`GreedyBatch` and :class:`JoiningRows`), ``PromptProcessingBatch``,
  ``StopSequences``, ``generation_stream`` and ``maybe_set_recommended_wired_limit``
  (``core.engine.decode_batch``, ``batch_prefill``, ``scheduler``, ``generation``);
- ``tokenizer_utils._infer_tool_parser`` (the tool-call format a chat template writes)
  and ``TokenizerWrapper._tokenizer`` (the Hugging Face tokenizer inside);
- how llama-style models are written: the attention and MLP classes whose forward the CPU
  speed-ups rewrite and the fields it reads, the module-level
  ``scaled_dot_product_attention`` their attention calls (which the speed-ups wrap), and
  which models' ``Model.__call__`` is ``head(model(inputs, cache))``
  (``core.engine.cpu_speedups``, ``core.engine.generation``);
- ``utils.MODEL_REMAPPING`` and ``models.pipeline.PipelineMixin`` (``core.distributed``);
- which member of a ``Model`` gives the hidden states its head reads, the output of the
  final norm (``hidden_states``: ``core.engine.embedding``).

``tests/core/test_mlx_lm_compat.py`` checks every name, field and signature relied on
here and, when one fails, says which mlx-lm change broke which part of RadixChat.
``pyproject.toml`` pins mlx-lm to the range that test passed on (``docs/compat.md``).

Importing this module imports mlx-lm's generation code (and with it transformers, a few
seconds cold): modules that must stay light import it inside their functions.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch, StopSequences, generation_stream
from mlx_lm.models import llama, qwen2
from mlx_lm.models.pipeline import PipelineMixin
from mlx_lm.sample_utils import greedy_sampler
from mlx_lm.tokenizer_utils import _infer_tool_parser
from mlx_lm.utils import MODEL_REMAPPING, maybe_set_recommended_wired_limit

__all__ = [
    "ATTENTION_FIELDS",
    "GreedyBatch",
    "JoiningRows",
    "PromptProcessingBatch",
    "attention_function",
    "backbone_and_head",
    "generation_stream",
    "has_pipeline",
    "hf_tokenizer",
    "hidden_states",
    "infer_tool_parser",
    "llama_style_blocks",
    "maybe_set_recommended_wired_limit",
    "model_class",
    "replace_attention_function",
    "writes_json_tool_calls",
]


# ---------------------------------------------------------------------- the decode batch
class JoiningRows(GenerationBatch):
    """Rows joining the decode batch with their next input known (``tokens``, one a row,
    on top of ``caches``, merged batch caches holding ``cache_tokens``): constructing them
    computes nothing (``GenerationBatch.__init__`` steps its rows at once; here that step
    is empty), and each row carries ``placeholder`` for the log-probabilities of that
    input, which the running batch reports at its next step."""

    def __init__(
        self,
        model,
        uids: list[int],
        tokens: list[int],
        caches: list,
        cache_tokens: list[list[int]],
        samplers: list,
        processors: list,
        max_tokens: list[int],
        placeholder: mx.array,
    ):
        super().__init__(
            model,
            uids,
            mx.array(tokens, dtype=mx.uint32),
            caches,
            [list(t) for t in cache_tokens],
            list(samplers),
            greedy_sampler,
            [list(p) for p in processors],
            [StopSequences() for _ in uids],
            list(max_tokens),
        )
        self._next_logprobs = [placeholder] * len(self.uids)

    def _step(self):
        return [], []  # only from __init__: the running batch steps these rows


class GreedyBatch(GenerationBatch):
    """mlx-lm's ``GenerationBatch`` with one shortcut. When every row is greedy (mlx-lm's
    ``greedy_sampler``, no logits processors) the next tokens are the argmax of the logits
    as they come: normalising them first (``logits - logsumexp``, on ``rows x vocab``
    values, which the greedy choice does not depend on) costs a few percent of a step
    (measured: docs/benchmarks.md), for log-probabilities nobody reads; each row
    reports ``placeholder`` instead. Any other row takes mlx-lm's own step. A subclass
    may wrap the forward (:meth:`forward_context`)."""

    placeholder: mx.array  # the log-probabilities a greedy step reports

    def forward_context(self):
        """A context the step's forward runs in (nothing here)."""
        return contextlib.nullcontext()

    def _step(self):
        if any(self.logits_processors) or any(
            s is not None and s is not greedy_sampler for s in self.samplers
        ):
            return super()._step()
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        with self.forward_context():
            logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        self._next_tokens = mx.argmax(logits, axis=-1)
        self._next_logprobs = [self.placeholder] * len(self.uids)  # what was not computed
        mx.async_eval(self._next_tokens)
        mx.eval(inputs, self._current_logprobs)  # as mlx-lm's step: this step's tokens
        inputs = inputs.tolist()
        for held, token in zip(self.tokens, inputs):
            held.append(token)
        return inputs, self._current_logprobs


def row_to_park(batch: GenerationBatch, index: int) -> tuple[int, int]:
    """What row ``index`` of a running ``batch`` needs to leave and come back later: its next
    input token (sampled at the last step, not yet reported) and the tokens it may still
    generate (its ``max_tokens`` less those generated)."""
    token = int(batch._next_tokens[index].item())
    return token, batch.max_tokens[index] - batch._num_tokens[index]


# ---------------------------------------------------------------------- tokenizers
def infer_tool_parser(hf_tokenizer) -> str | None:
    """The name of the ``mlx_lm.tool_parsers`` module for the tool calls ``hf_tokenizer``'s
    chat template writes (the table mlx-lm's own ``load`` uses), or None."""
    return _infer_tool_parser(hf_tokenizer)


def hf_tokenizer(tokenizer):
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` (``tokenizer`` itself
    when it is not wrapped)."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


JSON_TOOL_PARSER = "mlx_lm.tool_parsers.json_tools"


def writes_json_tool_calls(parse) -> bool:
    """Whether ``parse`` (a tool parser's ``parse_tool_call``) is mlx-lm's JSON one: the call
    between the markers is ``{"name": ..., "arguments": {...}}``."""
    return getattr(parse, "__module__", "") == JSON_TOOL_PARSER


# ---------------------------------------------------------------------- model internals
# What the CPU speed-ups' rows-as-rows attention reads of mlx-lm's llama-style attention.
ATTENTION_FIELDS = (
    "rope",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "n_heads",
    "n_kv_heads",
    "scale",
)
ATTENTION_FUNCTION = "scaled_dot_product_attention"  # looked up in the attention class's module


def llama_style_blocks() -> dict[type, str]:
    """mlx-lm's llama-style blocks, ``"attention"`` or ``"mlp"``: their forwards are
    ``__call__(x, mask=None, cache=None)`` (attention, reading :data:`ATTENTION_FIELDS`)
    and ``__call__(x)`` (the MLP, any leading shape)."""
    return {
        llama.Attention: "attention",
        qwen2.Attention: "attention",
        llama.MLP: "mlp",
        qwen2.MLP: "mlp",
    }


def attention_function(module_class: type) -> Callable | None:
    """The ``scaled_dot_product_attention`` that ``module_class``'s forward calls (a global of
    its mlx-lm module), or None where its module has none."""
    found = getattr(sys.modules.get(module_class.__module__), ATTENTION_FUNCTION, None)
    return found if callable(found) else None


def replace_attention_function(module_class: type, function: Callable) -> None:
    """Have ``module_class``'s module (so every model of that kind) call ``function`` for
    its attention; it takes what mlx-lm's ``scaled_dot_product_attention`` takes."""
    setattr(sys.modules[module_class.__module__], ATTENTION_FUNCTION, function)


# mlx-lm architectures whose ``Model.__call__`` is exactly ``head(self.model(inputs,
# cache))``, with the head ``self.lm_head`` or, tied, ``self.model.embed_tokens.as_linear``;
# the value says where the "tied" flag lives.
BACKBONE_THEN_HEAD = {
    "mlx_lm.models.llama": "args.tie_word_embeddings",
    "mlx_lm.models.qwen2": "args.tie_word_embeddings",
    "mlx_lm.models.qwen3": "args.tie_word_embeddings",
    "mlx_lm.models.smollm3": "args.tie_word_embeddings",
    "mlx_lm.models.gemma3_text": "tie_word_embeddings",
}


def backbone_and_head(model):
    """``(backbone, head)`` of a model listed in :data:`BACKBONE_THEN_HEAD` (its forward is
    ``head(backbone(inputs, cache))``), else None."""
    tied = BACKBONE_THEN_HEAD.get(type(model).__module__)
    if tied is None or type(model).__name__ != "Model":
        return None
    flag = model
    for name in tied.split("."):
        flag = getattr(flag, name)
    return model.model, (model.model.embed_tokens.as_linear if flag else model.lm_head)


# The members of mlx-lm's ``Model`` that give the hidden states its head reads (the final
# norm's output), called ``member(inputs, cache=caches)``: the first one a model has.
HIDDEN_STATE_MEMBERS = ("model", "backbone", "transformer", "language_model.model")
# Architectures where that member does not give them, and why.
NO_HIDDEN_STATES = {
    "mlx_lm.models.gemma3n": "its text model applies the output head itself",
    "mlx_lm.models.gpt_neox": "its text model applies the output head itself",
    "mlx_lm.models.lille-130m": "its text model applies the output head itself",
    "mlx_lm.models.phixtral": "its final norm belongs to the output head",
}


def hidden_states(model) -> tuple[Callable | None, str]:
    """``(member, "")``: the member of ``model`` whose ``member(inputs, cache=caches)`` is
    the ``(batch, tokens, hidden)`` states its output head reads; or ``(None, why)`` where
    its architecture gives no such member (:data:`NO_HIDDEN_STATES`)."""
    module = type(model).__module__
    if module in NO_HIDDEN_STATES:
        return None, NO_HIDDEN_STATES[module]
    for path in HIDDEN_STATE_MEMBERS:
        member = model
        for name in path.split("."):
            member = getattr(member, name, None)
        if callable(member):
            return member, ""
    return None, f"its mlx-lm class has none of {', '.join(HIDDEN_STATE_MEMBERS)}"


def model_class(model_type: str):
    """mlx-lm's ``Model`` class for a config's ``model_type`` (as its loader finds it:
    ``MODEL_REMAPPING``, then ``mlx_lm.models.<type>``), or None where it has none."""
    model_type = MODEL_REMAPPING.get(model_type, model_type)
    try:
        return importlib.import_module(f"mlx_lm.models.{model_type}").Model
    except (ImportError, AttributeError):
        return None


def has_pipeline(model_cls: type) -> bool:
    """Whether ``model_cls``'s mlx-lm module has a model split by layers (a ``PipelineMixin``)."""
    module = importlib.import_module(model_cls.__module__)
    return any(
        isinstance(v, type) and issubclass(v, PipelineMixin) and v is not PipelineMixin
        for v in vars(module).values()
    )
