"""``radixchat --screenshot PATH``: the window in a realistic state, rendered to a PNG.

In a scratch data folder (the user's chats and cache are not touched; the model file is
linked from the real data folder) it chats two turns on the model, "restarts" (a new
engine on the same folder: the session's KV comes back from the disk cache), opens the
window on that chat and asks a third question in it, so the cache panel shows RAM hits,
a disk restore and computed tokens, and the memory panel live figures. Then it grabs the
window. Greedy decoding, so the picture is reproducible.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

QUESTIONS = (
    "What is the capital of France?",
    "Name three famous landmarks there, as a list.",
    "How do I reverse a string in Python? Give a short code example.",
)
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 160, "seed": None}
SYSTEM_PROMPT = "You are a helpful assistant. Answer clearly and briefly."
SIZE = (1440, 900)
WAIT_MS = 600_000


def run_screenshot(path: Path, data_root: Path, model_spec: str) -> int:
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.look import apply_look
    from app.main_window import MainWindow
    from app.settings_dialogs import AppSettings
    from core.chats.store import ChatStore
    from core.errors import UserError
    from core.models.pypi import provision
    from core.paths import chats_db_path

    app = QApplication.instance() or QApplication(sys.argv)
    apply_look(app)
    with tempfile.TemporaryDirectory(prefix="radixchat-screenshot-") as scratch:
        root = Path(scratch)
        spec = link_known_model(model_spec, data_root, root, provision)
        with ChatStore(chats_db_path(root)) as store:
            session = store.create_session(settings=dict(SAMPLING), system_prompt=SYSTEM_PROMPT)
            _two_turns_then_restart(root, spec, store, session)

            settings = AppSettings(
                QSettings(str(root / "settings.ini"), QSettings.Format.IniFormat)
            )
            bridge = EngineBridge(root, spec)
            window = MainWindow(bridge, store, settings, server_port=0)
            window.resize(*SIZE)
            window.show()
            try:
                ok, why = run_until_signal(app, bridge.modelReady, bridge.loadFailed, bridge.start)
                if not ok:
                    raise UserError(f"the model did not load: {why}")
                ok, why = run_until_signal(
                    app, bridge.finished, bridge.failed, lambda: window.send(QUESTIONS[2])
                )
                if not ok:
                    raise UserError(f"the third turn failed: {why}")
                loop = QEventLoop()
                QTimer.singleShot(1600, loop.quit)  # one more idle poll of the panels
                loop.exec()
                path.parent.mkdir(parents=True, exist_ok=True)
                if not window.grab().save(str(path)):
                    raise UserError(f"could not write {path}")
            finally:
                window.close()
                bridge.shutdown()
    print(path)
    return 0


def link_known_model(model_spec: str, data_root: Path, root: Path, provision) -> str:
    """The model as seen from the scratch folder: known models are linked into its models/."""
    if model_spec not in provision.KNOWN_MODELS:
        return model_spec
    source = provision.ensure_model(model_spec, data_root)
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / source.name).symlink_to(source)
    return model_spec


def _two_turns_then_restart(root: Path, spec: str, store, session) -> None:
    """Turns 1 and 2 in an engine that then shuts down: its cache stays on disk."""
    from core.engine import namespaces
    from core.engine.engine import Engine
    from core.engine.types import (
        ChatMessage,
        DoneEvent,
        ErrorEvent,
        GenerationRequest,
        SamplingParams,
    )
    from core.errors import UserError

    engine = Engine(root, spec).start()
    try:
        engine.wait_ready()
        history = [ChatMessage("system", SYSTEM_PROMPT)]
        for question in QUESTIONS[:2]:
            request = GenerationRequest(
                messages=tuple(history) + (ChatMessage("user", question),),
                sampling=SamplingParams(**SAMPLING),
                session=session.name,
                cache_namespace=namespaces.APP,
            )
            done = None
            for event in engine.stream(request):
                if isinstance(event, ErrorEvent):
                    raise UserError(event.message)
                if isinstance(event, DoneEvent):
                    done = event
            store.add_turn(session.id, question, done.text, dataclasses.asdict(done.stats))
            history += [ChatMessage("user", question), ChatMessage("assistant", done.text)]
        engine.flush_disk_cache()
    finally:
        engine.shutdown()


def run_until_signal(app, ok_signal, fail_signal, start) -> tuple[bool, str]:
    """Run ``start`` and the event loop until ``ok_signal`` (True, "") or ``fail_signal``
    (False, its message); (False, "timed out") after ``WAIT_MS``."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    result = [False, "timed out"]

    def finish(ok: bool, why: str = "") -> None:
        result[:] = [ok, why]
        loop.quit()

    def on_ok(*_args) -> None:
        finish(True)

    def on_fail(message: str = "", *_args) -> None:
        finish(False, message)

    ok_signal.connect(on_ok)
    fail_signal.connect(on_fail)
    QTimer.singleShot(WAIT_MS, loop.quit)
    start()
    loop.exec()
    ok_signal.disconnect(on_ok)
    fail_signal.disconnect(on_fail)
    return result[0], result[1]
