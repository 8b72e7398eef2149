"""Render RadixChat's icons from resources/RadixChat.svg.

    .venv/bin/pip install -e ".[package]"       # Pillow, for the .icns
    QT_QPA_PLATFORM=offscreen .venv/bin/python resources/make_icons.py

Writes RadixChat.png (512 px, window and Linux icon), RadixChat-256.png and
RadixChat.icns (macOS: 16 to 1024 px, each size rendered from the SVG rather than
scaled down from one bitmap). The outputs are committed; run this again after editing
the SVG. Qt draws the SVG (QtSvg + QPainter); Pillow only packs the .icns.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SVG = HERE / "RadixChat.svg"
PNG_SIZES = {"RadixChat.png": 512, "RadixChat-256.png": 256}
ICNS = HERE / "RadixChat.icns"
ICNS_SIZES = (16, 32, 64, 128, 256, 512, 1024)


def render_png(size: int) -> bytes:
    """The SVG drawn at ``size`` x ``size`` pixels, antialiased, as PNG bytes."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"make_icons: {SVG} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(0)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(data)


def write_icns(path: Path) -> None:
    from PIL import Image

    images = [Image.open(io.BytesIO(render_png(size))).convert("RGBA") for size in ICNS_SIZES]
    largest, smaller = images[-1], images[:-1]
    largest.save(path, format="ICNS", append_images=smaller)


def main() -> int:
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QImage text needs it)
    for name, size in PNG_SIZES.items():
        (HERE / name).write_bytes(render_png(size))
        print(f"wrote {HERE / name} ({size} px)")
    try:
        import PIL  # noqa: F401
    except ImportError:
        print(
            (
                "make_icons: Pillow is missing (pip install -e '.[package]'): RadixChat.icns not "
                "written"
            ),
            file=sys.stderr,
        )
        return 1
    write_icns(ICNS)
    print(f"wrote {ICNS} ({', '.join(map(str, ICNS_SIZES))} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
