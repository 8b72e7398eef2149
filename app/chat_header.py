"""What the window says of a chat and of the model above the chat: the header line (its
system prompt, the preset or default its settings are, its temperature) and a base
model's notice."""

from __future__ import annotations

import html

from app.chat_settings import ChatPreset, PresetStore, same
from core.chats.store import Session
from core.models.base_models import BASE_LABEL


def chat_header_text(session: Session, sampling: dict, presets: PresetStore) -> str:
    """What the header above the chat says of its settings (rich text, one line)."""
    prompt = " ".join((session.system_prompt or "").split())
    if len(prompt) > 60:
        prompt = prompt[:59] + "…"
    parts = [f"System prompt: “{html.escape(prompt)}”" if prompt else "No system prompt"]
    current = ChatPreset("", session.system_prompt, sampling)
    named = [name for name, preset in sorted(presets.presets.items()) if same(preset, current)]
    if named:
        parts.append(f"preset {html.escape(named[0])}")
    elif presets.new_chat_defaults is not None and same(presets.new_chat_defaults, current):
        parts.append("the new-chat default")
    parts.append(f"temperature {sampling.get('temperature', 0):g}")
    return " · ".join(parts) + ' · <a href="settings">Chat Settings…</a>'


def base_model_notice(name: str) -> str:
    """What the chat view says above the messages while a base model is loaded."""
    return (
        f"{name} is a base model ({BASE_LABEL}): it continues text rather than answering, "
        "and rarely ends its turn. Replies go through a fallback chat template; to chat, pick "
        "an instruct model (Model…)."
    )
