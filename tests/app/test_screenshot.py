"""``radixchat --screenshot`` on a tiny model, in-process."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtGui import QImage  # noqa: E402

from app.screenshot import SIZE, run_screenshot  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.models.tiny_model import TinyModelSpec, write_tiny_model  # noqa: E402


def test_the_screenshot_shows_a_three_turn_chat_and_leaves_the_data_folder_alone(
    qtbot, tmp_path, capsys
):
    model = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=4096))
    data = tmp_path / "data"
    data.mkdir()
    shot = tmp_path / "docs" / "shot.png"
    assert run_screenshot(shot, data, str(model)) == 0
    assert capsys.readouterr().out.strip() == str(shot)
    image = QImage(str(shot))
    assert (image.width(), image.height()) == SIZE
    # not blank
    assert (
        len({image.pixel(x, y) for x in range(0, SIZE[0], 37) for y in range(0, SIZE[1], 29)}) > 8
    )
    assert list(data.iterdir()) == []  # a scratch folder held the chats and the cache


def test_a_failed_turn_says_why(qtbot, tmp_path, tiny_model):
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(
        UserError,
        match="the third turn failed: the prompt is .* tokens but .* has a context of 512",
    ):
        # its 512-token context is too short
        run_screenshot(tmp_path / "shot.png", data, str(tiny_model))
