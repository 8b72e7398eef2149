"""Render the model picker mid-download to a PNG (the README's picture).

    QT_QPA_PLATFORM=offscreen python -m tests.app.picker_shot docs/images/picker-download.png

A loopback hub serves a few repos named like real ones (their hub cards give the
parameter counts the fits column uses; the files are a tiny model and 120 MB of
weights, sent at 25 MB/s); the picker searches "qwen3", downloads the 4-bit 4B, and is
grabbed once the bar is past a third.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tests.core.models.hub.hub_fixture import HubFile, HubRepo, LoopbackHub, make_sources  # noqa: E402


def _card(total_params: int, bits: int) -> dict:
    packed = int(total_params * 0.9) * bits // 32
    return {
        "parameters": {"U32": packed, "BF16": int(total_params * 0.1)},
        "total": packed + int(total_params * 0.1),
    }


def main(out: Path) -> int:
    work = Path(tempfile.mkdtemp(prefix="picker-shot-"))
    sources = make_sources(work / "src")
    weights = work / "model.safetensors"
    weights.write_bytes(os.urandom(120 << 20))
    model = {
        p.name: HubFile(p.name, data=p.read_bytes())
        for p in sources.tiny.iterdir()
        if p.name != weights.name
    }
    hub = LoopbackHub()
    mlx = dict(tags=["mlx"], library_name="mlx")
    for repo_id, params, bits, downloads in (
        ("mlx-community/Qwen3-4B-4bit", 4_000_000_000, 4, 412_000),
        ("mlx-community/Qwen3-8B-4bit", 8_200_000_000, 4, 201_000),
        ("mlx-community/Qwen3-1.7B-8bit", 1_700_000_000, 8, 98_000),
        ("mlx-community/Qwen3-30B-A3B-4bit", 30_500_000_000, 4, 156_000),
        ("mlx-community/Qwen3-235B-A22B-4bit", 235_000_000_000, 4, 9_100),
    ):
        files = {**model, "model.safetensors": HubFile("model.safetensors", source=weights)}
        hub.add(
            HubRepo(
                repo_id,
                files,
                downloads=downloads,
                config={"model_type": "qwen3", "quantization": {"bits": bits}},
                safetensors=_card(params, bits),
                **mlx,
            )
        )
    hub.add(
        HubRepo(
            "unsloth/Qwen3-4B-GGUF",
            {
                "Qwen3-4B-Q4_K_M.gguf": HubFile(
                    "Qwen3-4B-Q4_K_M.gguf", data=sources.gguf.read_bytes()
                )
            },
            downloads=350_000,
            tags=["gguf"],
            gguf={"total": 4_022_468_096, "architecture": "qwen3"},
        )
    )
    hub.rate = 25e6
    os.environ.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_CACHE=str(work / "hf"))

    from app.model_picker import ModelPickerDialog

    app = QApplication.instance() or QApplication(sys.argv)
    (work / "data").mkdir()
    dialog = ModelPickerDialog(work / "data", None, on_cpu=False)
    dialog.resize(900, 520)
    dialog.show()
    dialog.tabs.setCurrentIndex(1)
    panel = dialog.hub_panel
    panel.query.setText("qwen3")
    grabbed = []

    def on_results_shown() -> None:
        if panel.results.topLevelItemCount() and not panel.is_downloading() and not grabbed:
            panel.results.setCurrentItem(panel.results.topLevelItem(0))
            panel.start_download()

    def on_progress(p) -> None:
        if p.fraction > 0.35 and not grabbed:
            grabbed.append(dialog.grab().save(str(out)))
            panel.cancel_download()
            QTimer.singleShot(500, app.quit)

    panel.search_button.clicked.emit()
    timer = QTimer()
    timer.timeout.connect(on_results_shown)
    timer.start(100)
    panel.progressed.connect(on_progress)
    QTimer.singleShot(60_000, app.quit)
    app.exec()
    hub.close()
    print(out if grabbed and grabbed[0] else "no picture")
    return 0 if grabbed and grabbed[0] else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "picker-download.png")))
