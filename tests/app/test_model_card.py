"""Issue 45.8: the model info card (Model › Model Info…, Ctrl+I) on a real (tiny) model: what
it is, its chat template viewable, what the cache holds for it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QPlainTextEdit  # noqa: E402

from app.model_card import card_rows  # noqa: E402
from core.models.describe import ModelDescription  # noqa: E402
from tests.app.window_fakes import WAIT_MS, make_greedy, send_turn, wait_ready  # noqa: E402


def test_the_card_says_what_the_model_is_and_what_the_cache_holds(qtbot, open_window, tiny_model):
    (tiny_model / "README.md").write_text("---\nlicense: apache-2.0\ntags: [x]\n---\n# tiny\n")
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store, max_tokens=8)
    send_turn(qtbot, window, bridge, "Hello there")
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS):
        bridge.poll_stats()
    window.model_info_action.trigger()
    card = window.model_card
    assert card is not None and card.isVisible()
    rows = card.rows
    info = bridge.model_info
    assert rows["Architecture"] == "llama" and rows["File"] == str(tiny_model)
    assert rows["Parameters"].endswith(" M") and rows["Layers"] == str(info.num_layers)
    assert rows["Context length"] == f"{info.context_length:,} tokens"
    assert rows["Kind"] == "instruct (chat)" and rows["License"] == "apache-2.0"
    assert "in memory" in rows["Quantization"] and info.weights_format in rows["Quantization"]
    assert rows["Cache"].startswith("in RAM ") and "tokens of 1 chat" in rows["Cache"]
    assert card.values["File"].text() == str(tiny_model)
    card.template_button.click()
    text = card.template_view.findChild(QPlainTextEdit, "templateText")
    assert text.toPlainText() == info.chat_template and "{%" in text.toPlainText()
    assert text.isReadOnly()


def test_a_base_model_without_facts_in_its_files_says_so():
    class Info:
        name, model_type, num_layers, context_length = "m", "gemma3", 18, 32768
        weights_format, weight_bytes, path, fingerprint = "float32", 10**9, "/x/m.gguf", "f"
        base, parameters, chat_template = True, 268_000_000, ""

    rows = card_rows(Info(), ModelDescription(format="gguf", quantization="Q4_K_M"), None)
    assert rows["Kind"].startswith("base") and rows["License"] == "not stated in its files"
    assert rows["Parameters"] == "268.0 M" and rows["Quantization"].startswith("Q4_K_M in its file")
    assert rows["Chat template"] == "none (a fallback template)" and rows["Cache"] == "—"
