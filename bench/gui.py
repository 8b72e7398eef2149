"""``radixchat bench gui``: how responsive the window stays while a reply streams (the one
benchmark that imports the app).

The real window on the model (in a scratch data folder) answers a prompt while a precise
5 ms timer runs on the GUI thread; each tick's lateness (the time since the previous
tick, minus 5 ms) is how long the event loop was kept from the user: input, painting
and the panels all wait that long. Reported: p50 / p99 / max over every tick of a whole
reply (from Send to the last token), per reply, and the medians over the replies.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TICK_MS = 5
PROMPT = "Write a short story about a lighthouse keeper and a storm, in three paragraphs."


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def _stamper(ticks: list[float]) -> Callable[[], None]:
    """A timer slot that appends the time to ``ticks``: this run's list, bound here rather
    than read from the loop's variable when the slot runs."""
    return lambda: ticks.append(time.perf_counter())


def run_bench_gui(args) -> int:
    """``radixchat bench gui``: the real window, in a scratch data folder, on ``args.model``
    (found in the data folder ``args.data_dir`` names)."""
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.look import apply_look
    from app.main_window import MainWindow
    from app.screenshot import link_known_model, run_until_signal
    from app.settings_dialogs import AppSettings
    from core.chats.store import ChatStore
    from core.errors import UserError
    from core.models.pypi import provision
    from core.paths import chats_db_path, data_dir

    data_root = data_dir(args.data_dir)
    app = QApplication.instance() or QApplication(sys.argv)
    apply_look(app)
    runs = []
    with tempfile.TemporaryDirectory(prefix="radixchat-bench-gui-") as scratch:
        root = Path(scratch)
        spec = link_known_model(args.model, data_root, root, provision)
        with ChatStore(chats_db_path(root)) as store:
            settings = AppSettings(
                QSettings(str(root / "settings.ini"), QSettings.Format.IniFormat)
            )
            bridge = EngineBridge(root, spec)
            window = MainWindow(bridge, store, settings, server_port=0)
            window.resize(1280, 800)
            window.show()
            try:
                ok, why = run_until_signal(app, bridge.modelReady, bridge.loadFailed, bridge.start)
                if not ok:
                    raise UserError(f"the model did not load: {why}")
                for _ in range(args.repeats):
                    window.new_chat()
                    store.update_session(
                        window.session.id,
                        settings={
                            "temperature": 0.0,
                            "top_p": 1.0,
                            "max_tokens": args.max_tokens,
                            "seed": None,
                        },
                    )
                    window.session = store.get_session_by_id(window.session.id)
                    ticks: list[float] = []
                    timer = QTimer()
                    timer.setTimerType(Qt.TimerType.PreciseTimer)
                    timer.timeout.connect(_stamper(ticks))
                    tokens = []
                    bridge.token.connect(tokens.append)
                    timer.start(TICK_MS)
                    ticks.append(time.perf_counter())
                    ok, why = run_until_signal(
                        app, bridge.finished, bridge.failed, lambda: window.send(PROMPT)
                    )
                    timer.stop()
                    bridge.token.disconnect(tokens.append)
                    if not ok:
                        raise UserError(f"the reply failed: {why}")
                    late = [max(0.0, (b - a) * 1000 - TICK_MS) for a, b in zip(ticks, ticks[1:])]
                    runs.append(
                        {
                            "tokens": len(tokens),
                            "ticks": len(late),
                            "seconds": ticks[-1] - ticks[0],
                            "p50_ms": percentile(late, 50),
                            "p99_ms": percentile(late, 99),
                            "max_ms": max(late, default=0.0),
                        }
                    )
                    pause = QEventLoop()
                    QTimer.singleShot(300, pause.quit)
                    pause.exec()
            finally:
                window.close()
                bridge.shutdown()
    result = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "tick_ms": TICK_MS,
        "runs": runs,
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "max_ms": statistics.median(r["max_ms"] for r in runs),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    for i, run in enumerate(runs, 1):
        print(
            f"reply {i}: {run['tokens']} pieces in {run['seconds']:.1f} s, {run['ticks']} ticks: "
            f"lateness p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms, max "
            f"{run['max_ms']:.1f} ms"
        )
    print(
        f"median over {len(runs)} replies: p50 {result['p50_ms']:.2f} ms, p99 "
        f"{result['p99_ms']:.2f} ms (target p99 < 50 ms)"
    )
    return 0
