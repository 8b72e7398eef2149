"""What both wire formats share: strict pydantic bodies, text that is valid Unicode, and the
model card the server serves.

Every request body is a :class:`WireModel`: strict (``"1"`` is not a number, ``true`` is
not ``1``, ``1e400`` -- infinity to Python's json module -- is not finite), unknown
fields ignored (clients send fields of newer API versions), and every string a
:data:`Text`, valid Unicode (JSON's ``"\\ud800"`` escape gives Python a lone
surrogate, which cannot be encoded: refused here, naming the field, instead of failing
later in the tokenizer or the chat store).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

MAX_SESSION_CHARS = 256
MAX_PRIORITY = 2**31 - 1
# a request's priority where its body cannot carry one (Anthropic SDKs)
PRIORITY_HEADER = "X-RadixChat-Priority"
MAX_SALT_CHARS = 256
CACHE_SALT_TEXT = (
    "a secret of the client's: cached prompt prefixes are shared only with requests "
    "that send the same salt (with the same API key)"
)
MODEL_ALIASES = ("default",)


def _unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "invalid_unicode",
            "not valid Unicode text: a lone surrogate (U+{code}) at character {position}",
            {"code": f"{ord(value[exc.start]):04X}", "position": exc.start},
        ) from None
    return value


Text = Annotated[str, AfterValidator(_unicode)]


class WireModel(BaseModel):
    """A request body or a part of one."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class RadixChatOptions(WireModel):
    """RadixChat's own options of one request: the body's ``radixchat`` object (both
    dialects)."""

    speculative: Literal["off", "ngram", "draft"] | None = Field(
        None,
        description="speculative decoding for this request: off, ngram (drafts from the "
        "prompt and the cache) or draft (the server's --draft-model); default: the server's",
    )


@dataclass(frozen=True)
class ModelCard:
    """What the server says about the loaded model."""

    id: str
    fingerprint: str
    context_length: int
    aliases: frozenset[str]
    created: int
    # how the model's prefixes are cached: "pages", "snapshots", "pages+snapshots" or "off
    # (why)"; and the cache layout in one line ("" when not asked for, see model_card)
    cached_as: str = ""
    cache_layout: str = ""
    # how K/V are stored per layer kind ({"full": "8-bit (group 64)", ...}; kvcache.kv_pages)
    kv_format: tuple[tuple[str, str], ...] = ()
    # names the user gave the model (``--alias``): /v1/models lists each beside its id
    listed: tuple[str, ...] = ()
    # a base model: completion only (core.models.base_models); /v1/models says so
    base: bool = False
