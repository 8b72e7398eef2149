"""Chats out (Markdown, JSON with each reply's model and settings) and in (a JSON export or a
plain list of messages, as a new chat); anything else is one line and writes nothing."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.chats import transfer
from core.chats.settings import RANGES
from core.chats.store import ChatStore
from core.chats.turn import ChatTurn, MadeWith
from core.engine.types import RequestStats
from core.errors import StoreError, UserError

SAMPLING = {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1}


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.db") as opened:
        yield opened


def _chat(store: ChatStore) -> int:
    session = store.create_session(system_prompt="Be brief.", settings=SAMPLING)
    for prompt, reply, model in (("hi", "Hello!", "smollm2"), ("and?", "Fine.", "gemma3")):
        turn = ChatTurn.start(store, store.get_session_by_id(session.id), prompt)
        stats = RequestStats(prompt_tokens=12, computed_tokens=12, completion_tokens=3)
        assert turn.finish(store, reply, stats, MadeWith(model, SAMPLING))
    return session.id


def test_json_export_has_each_replys_model_and_settings(store):
    data = transfer.export_json(store, _chat(store))
    assert data["format"] == "radixchat-chat" and data["version"] == 1
    assert data["title"] == "hi" and data["system_prompt"] == "Be brief."
    assert data["settings"] == SAMPLING
    first_reply = data["messages"][1]
    assert first_reply["role"] == "assistant" and first_reply["content"] == "Hello!"
    assert first_reply["model"] == "smollm2" and first_reply["sampling"] == SAMPLING
    assert first_reply["stats"]["completion_tokens"] == 3
    assert data["messages"][3]["model"] == "gemma3"
    assert data["messages"][0] == {"role": "user", "content": "hi"}
    json.dumps(data)  # JSON all through


def test_markdown_export_reads_as_a_conversation(store):
    text = transfer.export_markdown(store, _chat(store))
    assert text.startswith("# hi\n\n**System prompt:**\n\n> Be brief.\n")
    assert "## You\n\nhi\n" in text
    assert (
        "## Assistant · smollm2, temperature 0.2, top-p 0.9, top-k 40, "
        "repetition penalty 1.1\n\nHello!\n"
    ) in text
    assert "## Assistant · gemma3," in text


def test_an_export_comes_back_as_a_new_chat(store, tmp_path):
    original = _chat(store)
    path = tmp_path / "chat.json"
    assert transfer.write_export(store, original, path) == "json"
    done = transfer.import_chat(store, transfer.read_export(path))
    assert done.session.id != original and done.messages == 4
    assert done.session.title == "hi" and done.session.system_prompt == "Be brief."
    assert done.session.settings == SAMPLING
    back = store.messages(done.session.id)
    assert [(m.role, m.content) for m in back] == [
        (m.role, m.content) for m in store.messages(original)
    ]
    assert back[1].stats["model"] == "smollm2" and back[1].stats["sampling"] == SAMPLING
    assert transfer.write_export(store, done.session.id, tmp_path / "chat.md") == "markdown"
    assert (tmp_path / "chat.md").read_text().startswith("# hi\n")


def test_a_plain_list_of_messages_imports(store):
    done = transfer.import_chat(
        store,
        [
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": "Ahoy"},
            {"role": "assistant", "content": "Arr!"},
        ],
        title="Pirates",
    )
    assert done.session.system_prompt == "You are a pirate." and done.messages == 2
    assert done.session.title == "Pirates"
    assert [m.role for m in store.messages(done.session.id)] == ["user", "assistant"]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"hello": 1}, "not a chat"),
        ({"format": "other-app", "messages": []}, "not a chat this RadixChat reads"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "message 1: role 'wizard'"),
        ({"messages": [{"role": "user", "content": "ok"}, "text"]}, "message 2 is not an object"),
        ({"messages": [{"role": "user", "content": 7}]}, "message 1: its content is not text"),
    ],
)
def test_what_is_not_a_chat_is_one_line_and_writes_nothing(store, data, said):
    before = store.list_sessions()
    with pytest.raises(UserError) as raised:
        transfer.import_chat(store, data)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert store.list_sessions() == before


def test_unreadable_files_are_one_line(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UserError, match="is not a JSON chat"):
        transfer.read_export(tmp_path / "broken.json")
    with pytest.raises(UserError, match="cannot read"):
        transfer.read_export(tmp_path / "missing.json")


def test_a_replys_thinking_goes_out_and_comes_back(store, tmp_path):
    session = store.create_session(name="thinker")
    store.add_turn(session.id, "2+2?", "4", {"reasoning_tokens": 6}, reasoning="Two and two.")
    data = transfer.export_json(store, session.id)
    assert data["messages"][1]["reasoning"] == "Two and two."
    assert "reasoning" not in data["messages"][0]
    text = transfer.export_markdown(store, session.id)
    assert "## Assistant\n\n*Thinking:*\n\n> Two and two.\n\n4\n" in text
    back = store.messages(transfer.import_chat(store, data).session.id)
    assert [(m.content, m.reasoning) for m in back] == [("2+2?", None), ("4", "Two and two.")]
    with pytest.raises(UserError, match="reasoning is not text"):
        transfer.import_chat(store, [{"role": "assistant", "content": "4", "reasoning": 4}])


# ------------------------------------------------------------------ issue 42.4


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"version": "2", "messages": []}, "version '2'"),
        ({"version": [1], "messages": []}, "version [1]"),
        ({"version": None, "messages": []}, "version None"),
        ({"version": True, "messages": []}, "version True"),
        ({"version": 2, "messages": []}, "version 2"),
        ({"format": ["x"], "messages": []}, "format ['x']"),
        ({"messages": [[1]]}, "message 1 is not an object"),
        ({"messages": [{"role": ["user"], "content": "x"}]}, "message 1: role ['user']"),
        ({"messages": [{"role": "assistant", "content": "x", "stats": [1]}]}, "its stats"),
        ({"messages": [{"role": "assistant", "content": "x", "sampling": 3}]}, "its sampling"),
        ({"messages": [{"role": "assistant", "content": "x", "model": 3}]}, "its model"),
        ({"messages": [], "settings": "hot"}, "settings is not an object"),
        ({"messages": [], "settings": {"temperature": float("nan")}}, "settings.temperature"),
        ({"messages": [], "settings": {"max_tokens": float("inf")}}, "settings.max_tokens"),
        ({"messages": [], "settings": {"top_k": "5"}}, "settings.top_k must be a whole number"),
        ({"messages": [], "settings": {"top_p": 0}}, "settings.top_p must be a number"),
        ({"messages": [], "settings": {"seed": -1}}, "settings.seed"),
        ({"messages": [], "settings": {"stop": "x"}}, "settings.stop"),
        ({"messages": [], "title": 5}, "title is not text"),
        ({"messages": [{"role": "user", "content": "a\ud800"}]}, "not valid UTF-8"),
        ({"messages": [], "title": "a\udc00"}, "not valid UTF-8"),
        ({"messages": [{"role": "assistant", "content": "x", "stats": _deep(40)}]}, "nested"),
    ],
)
def test_every_malformed_shape_is_one_line_and_writes_nothing(store, data, said):
    before = store.list_sessions()
    with pytest.raises(UserError) as raised:
        transfer.import_chat(store, data)
    assert said in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    assert store.list_sessions() == before


def test_json_nested_100k_deep_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply") as raised:
        transfer.read_export(path)
    assert "\n" not in str(raised.value)


def test_settings_in_their_ranges_are_stored_and_unknown_keys_left_out(store):
    settings = {**SAMPLING, "max_tokens": 64.0, "seed": None, "stop": ["END"], "colour": "red"}
    done = transfer.import_chat(store, {"messages": [], "settings": settings})
    assert done.session.settings == {**SAMPLING, "max_tokens": 64, "seed": None, "stop": ["END"]}
    assert isinstance(done.session.settings["max_tokens"], int)


def test_an_import_is_one_transaction(store):
    """The chat's row and every message go in together: the disk filling up at the 40th
    message leaves no chat (on main each message was its own transaction: 39 stayed)."""
    store.db.execute(
        "CREATE TRIGGER full_at_40 BEFORE INSERT ON messages WHEN NEW.seq = 40 "
        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    with pytest.raises(StoreError, match="disk is full"):
        transfer.import_chat(store, [{"role": "user", "content": str(i)} for i in range(50)])
    assert store.list_sessions() == []
    assert store.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


# any JSON value (NaN and infinities too: Python's json reads them), text with lone
# surrogates and control characters
TEXT = st.text(st.characters(blacklist_categories=()), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(transfer.ROLES) | ANY_JSON,
        "content": TEXT | ANY_JSON,
        "stats": st.dictionaries(TEXT, ANY_JSON, max_size=3) | ANY_JSON,
        "model": TEXT | ANY_JSON,
        "sampling": st.dictionaries(TEXT, SCALARS, max_size=3) | ANY_JSON,
        "reasoning": TEXT | ANY_JSON,
    },
)
SETTINGS = (
    st.dictionaries(st.sampled_from([*RANGES, "stop", "other"]), SCALARS | ANY_JSON, max_size=4)
    | ANY_JSON
)
CHAT = st.fixed_dictionaries(
    {},
    optional={
        "format": st.just(transfer.FORMAT) | ANY_JSON,
        "version": st.just(transfer.VERSION) | ANY_JSON,
        "title": TEXT | ANY_JSON,
        "system_prompt": TEXT | ANY_JSON,
        "settings": SETTINGS,
        "messages": st.lists(MESSAGE | ANY_JSON, max_size=4) | ANY_JSON,
    },
)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory):
    with ChatStore(tmp_path_factory.mktemp("fuzz") / "chats.db") as opened:
        yield opened


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=CHAT | st.lists(MESSAGE | ANY_JSON, max_size=4) | ANY_JSON)
def test_any_json_shape_imports_or_is_one_line(fuzz_store, tmp_path_factory, data):
    """Whatever JSON the file holds: a new chat holding every message it counts, or one
    line (UserError) and nothing written; never a traceback."""
    path = tmp_path_factory.getbasetemp() / "fuzz-chat.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    before = {s.id for s in fuzz_store.list_sessions()}
    try:
        done = transfer.import_chat(fuzz_store, transfer.read_export(path))
    except UserError as exc:
        assert "\n" not in str(exc) and str(exc)
        assert {s.id for s in fuzz_store.list_sessions()} == before
    else:
        assert {s.id for s in fuzz_store.list_sessions()} == before | {done.session.id}
        assert len(fuzz_store.messages(done.session.id)) == done.messages


def test_export_and_import_carry_a_branch_and_a_replys_versions(store, tmp_path):
    chat = store.create_session("trip")
    store.add_turn(chat.id, "hi", "one")
    store.replace_last_turn(chat.id, "hi", "two", {"completion_tokens": 2}, reasoning="hmm")
    store.add_turn(chat.id, "and?", "fine")
    branch = store.branch_session(chat.id, 2)
    store.select_version(store.messages(branch.id)[1].id, 0)
    data = transfer.export_json(store, branch.id)
    assert data["branch_of"] == "trip" and data["fork_seq"] == 2
    reply = data["messages"][1]
    assert reply["content"] == "one" and reply["version"] == 0
    assert [v["content"] for v in reply["versions"]] == ["one", "two"]
    assert reply["versions"][1]["reasoning"] == "hmm"
    imported = transfer.import_chat(store, json.loads(json.dumps(data))).session
    assert imported.parent_id == chat.id and imported.fork_seq == 2
    again = store.messages(imported.id)[1]
    assert again.content == "one" and again.version == 0
    assert [v["content"] for v in again.versions] == ["one", "two"]
    assert again.versions[1]["stats"] == {"completion_tokens": 2}
    with pytest.raises(UserError, match="version"):
        transfer.import_chat(
            store, {**data, "messages": [data["messages"][0], {**reply, "version": 5}]}
        )
