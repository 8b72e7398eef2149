import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.chats.store import SCHEMA_VERSION, ChatStore, Message, Session
from core.errors import StoreError


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "chats.db"


@pytest.fixture
def store(db_path):
    with ChatStore(db_path) as store:
        yield store


@pytest.fixture
def raw(db_path, store):
    """A second plain connection to the same file, closed after the test."""
    conn = sqlite3.connect(db_path)
    yield conn
    conn.close()


def test_create_get_and_list_most_recent_first(store):
    work = store.create_session(
        "work", system_prompt="Be brief.", model="smollm2", settings={"temperature": 0.2, "seed": 7}
    )
    home = store.create_session("home")
    assert isinstance(work, Session)
    assert (work.name, work.title) == ("work", None)
    assert (work.system_prompt, work.model) == ("Be brief.", "smollm2")
    assert work.settings == {"temperature": 0.2, "seed": 7}
    assert home.settings == {} and home.system_prompt is None
    assert store.get_session("work") == work
    assert store.get_session_by_id(home.id) == home
    assert store.get_session("nope") is None and store.get_session_by_id(999) is None
    assert [s.name for s in store.list_sessions()] == ["home", "work"]
    store.add_message(work.id, "user", "hi")
    assert [s.name for s in store.list_sessions()] == ["work", "home"]
    assert store.get_session("work").updated_at > work.updated_at


def test_generated_names_are_unique(store):
    names = [store.create_session().name for _ in range(5)]
    assert len(set(names)) == 5
    assert all(name.startswith("chat-") for name in names)


def test_duplicate_or_empty_name_is_a_store_error(store):
    store.create_session("work")
    with pytest.raises(StoreError, match="already exists"):
        store.create_session("work")
    with pytest.raises(StoreError):
        store.create_session("  ")
    assert len(store.list_sessions()) == 1


def test_get_or_create_session(store):
    first = store.get_or_create_session("work", model="m")
    again = store.get_or_create_session("work", model="other")
    assert again == first and again.model == "m"


def test_messages_in_order_with_stats(store):
    s = store.create_session("s")
    store.add_message(s.id, "system", "You are terse.")
    user, reply = store.add_turn(s.id, "2+2?", "4", stats={"prompt_tokens": 12, "ttft": 0.05})
    assert isinstance(reply, Message)
    assert [(m.seq, m.role, m.content) for m in store.messages(s.id)] == [
        (1, "system", "You are terse."),
        (2, "user", "2+2?"),
        (3, "assistant", "4"),
    ]
    assert user.stats is None and reply.stats == {"prompt_tokens": 12, "ttft": 0.05}
    with pytest.raises(ValueError):
        store.add_message(s.id, "robot", "beep")
    with pytest.raises(StoreError):
        store.add_message(12345, "user", "nobody home")


def test_add_turn_is_atomic(store, raw):
    s = store.create_session("s")
    store.add_message(s.id, "user", "first")
    raw.execute("""CREATE TRIGGER no_replies BEFORE INSERT ON messages
                   WHEN NEW.role = 'assistant' BEGIN SELECT RAISE(ABORT, 'boom'); END""")
    raw.commit()
    before = store.get_session_by_id(s.id)
    with pytest.raises(sqlite3.IntegrityError, match="boom"):
        store.add_turn(s.id, "orphan?", "never stored")
    assert [m.content for m in store.messages(s.id)] == ["first"]
    assert store.get_session_by_id(s.id) == before
    store.add_message(s.id, "user", "still writable")  # no transaction left open


def test_title_from_first_user_message(store):
    s = store.create_session("s")
    store.add_message(s.id, "system", "system text is not a title")
    assert store.get_session_by_id(s.id).title is None
    store.add_turn(s.id, "\n  Plan a trip to Kyoto " + "x" * 80 + "\nsecond line", "ok")
    title = store.get_session_by_id(s.id).title
    assert title.startswith("Plan a trip to Kyoto") and len(title) <= 60
    store.add_message(s.id, "user", "later messages keep the title")
    assert store.get_session_by_id(s.id).title == title


def test_rename(store):
    s = store.create_session("s")
    store.rename_session(s.id, "  My title ")
    store.add_message(s.id, "user", "does not replace a title")
    renamed = store.get_session_by_id(s.id)
    assert (renamed.name, renamed.title) == ("s", "My title")
    with pytest.raises(StoreError):
        store.rename_session(999, "x")


def test_update_changes_only_given_fields(store):
    s = store.create_session("s", system_prompt="sp", model="m", settings={"top_p": 0.9})
    store.update_session(s.id, model="m2")
    assert store.get_session_by_id(s.id).system_prompt == "sp"
    assert store.get_session_by_id(s.id).settings == {"top_p": 0.9}
    store.update_session(s.id, system_prompt=None, settings={"temperature": 0.0})
    updated = store.get_session_by_id(s.id)
    assert (updated.system_prompt, updated.model) == (None, "m2")
    assert updated.settings == {"temperature": 0.0}
    assert updated.updated_at > s.updated_at


def test_delete_cascades(store, raw):
    keep, gone = store.create_session("keep"), store.create_session("gone")
    store.add_turn(keep.id, "a", "b")
    store.add_turn(gone.id, "c", "d")
    store.delete_session(gone.id)
    store.delete_session(gone.id)  # already gone: no error
    assert store.get_session_by_id(gone.id) is None
    orphans = raw.execute("SELECT count(*) FROM messages WHERE session_id = ?", [gone.id])
    assert orphans.fetchone() == (0,)
    assert len(store.messages(keep.id)) == 2


def test_delete_last_message(store):
    s = store.create_session("s")
    store.add_turn(s.id, "q", "bad answer")
    assert store.delete_last_message(s.id).content == "bad answer"
    store.add_message(s.id, "assistant", "good answer")
    assert [(m.seq, m.content) for m in store.messages(s.id)] == [(1, "q"), (2, "good answer")]
    store.delete_last_message(s.id)
    store.delete_last_message(s.id)
    assert store.delete_last_message(s.id) is None


def test_search_title_content_and_wildcards(store):
    a = store.create_session("a")
    store.add_turn(a.id, "Cooking pasta", "Boil WATER first")
    b = store.create_session("b")
    store.add_turn(b.id, "discount", "It is 50% off_today")
    c = store.create_session("c")
    store.add_turn(c.id, "discount", "It is 50 percent off today")
    assert [s.name for s in store.search("cooking")] == ["a"]
    assert [s.name for s in store.search("water")] == ["a"]
    assert [s.name for s in store.search("50%")] == ["b"]
    assert [s.name for s in store.search("off_")] == ["b"]
    assert {s.name for s in store.search("discount")} == {"b", "c"}
    assert store.search("nothing like this") == []
    assert len(store.search("")) == 3


def test_reopen_finds_everything(db_path):
    with ChatStore(db_path) as store:
        s = store.create_session("work", settings={"seed": 1})
        store.add_turn(s.id, "hello", "hi there", stats={"decode_tps": 30.5})
        expected = (store.list_sessions(), store.messages(s.id))
    with ChatStore(db_path) as store:
        assert (store.list_sessions(), store.messages(s.id)) == expected
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_newer_schema_is_refused(db_path):
    ChatStore(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 6}")
    conn.close()
    with pytest.raises(StoreError, match="newer") as info:
        ChatStore(db_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "content", [b"this is not a database at all" * 200, b"SQLite format 3\x00" + b"\x07" * 40]
)
def test_garbage_file_is_a_store_error(db_path, content):
    db_path.write_bytes(content)
    with pytest.raises(StoreError, match="chats.db"):
        ChatStore(db_path)


def test_truncated_database_is_a_store_error(db_path):
    with ChatStore(db_path) as store:
        for _ in range(10):
            store.add_turn(store.create_session().id, "question " * 200, "answer " * 300)
    data = db_path.read_bytes()
    db_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match="chats.db"):
        ChatStore(db_path)


def test_foreign_sqlite_database_is_refused(db_path):
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE other_app (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a RadixChat"):
        ChatStore(db_path)


def test_locked_on_open(db_path):
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("CREATE TABLE holding (x)")
        with pytest.raises(StoreError, match="locked by another RadixChat process"):
            ChatStore(db_path, timeout=0.1)
    finally:
        conn.close()


def test_locked_on_write(store, db_path):
    s = store.create_session("s")
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        with ChatStore(db_path, timeout=0.1) as second:
            assert second.get_session("s") == s  # WAL: readers are not blocked
            with pytest.raises(StoreError, match="locked"):
                second.add_message(s.id, "user", "blocked")
    finally:
        conn.close()
    store.add_message(s.id, "user", "free again")


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"), st.sampled_from(["system", "user", "assistant"]), st.text(max_size=20)
        ),
        st.tuples(st.just("delete")),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, database=None)
@given(ops=_ops)
def test_add_and_delete_match_a_list(ops):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "chats.db"
        model: list[tuple[str, str]] = []
        with ChatStore(path) as store:
            s = store.create_session()
            for op in ops:
                if op[0] == "add":
                    store.add_message(s.id, op[1], op[2])
                    model.append((op[1], op[2]))
                else:
                    removed = store.delete_last_message(s.id)
                    expected = model.pop() if model else None
                    assert (removed and (removed.role, removed.content)) == expected
            assert [(m.role, m.content) for m in store.messages(s.id)] == model
        with ChatStore(path) as store:
            assert [(m.role, m.content) for m in store.messages(s.id)] == model


def test_replace_last_turn_is_one_transaction(tmp_path):
    with ChatStore(tmp_path / "chats.db") as store:
        session = store.create_session()
        store.add_turn(session.id, "one", "first")
        store.add_turn(session.id, "two", "second")
        store.replace_last_turn(session.id, "two, edited", "third", {"completion_tokens": 1})
        assert [(m.role, m.content) for m in store.messages(session.id)] == [
            ("user", "one"),
            ("assistant", "first"),
            ("user", "two, edited"),
            ("assistant", "third"),
        ]
        # a failing insert (stats that are not JSON) rolls the delete back
        with pytest.raises(TypeError):
            store.replace_last_turn(session.id, "x", "y", {"bad": object()})
        assert [m.content for m in store.messages(session.id)] == [
            "one",
            "first",
            "two, edited",
            "third",
        ]


def test_replacing_the_last_turn_of_a_chat_without_one_appends(tmp_path):
    with ChatStore(tmp_path / "chats.db") as store:
        session = store.create_session()
        store.add_message(session.id, "system", "be brief")
        store.replace_last_turn(session.id, "hi", "hello")
        assert [(m.role, m.content) for m in store.messages(session.id)] == [
            ("system", "be brief"),
            ("user", "hi"),
            ("assistant", "hello"),
        ]


def test_a_replys_thinking_is_kept_beside_it(store):
    s = store.create_session("thinker")
    store.add_turn(s.id, "2+2?", "4", {"reasoning_tokens": 6}, reasoning="Two and two.")
    user, reply = store.messages(s.id)
    assert (user.reasoning, reply.reasoning, reply.content) == (None, "Two and two.", "4")
    store.replace_last_turn(s.id, "3+3?", "6", None, reasoning="Three and three.")
    assert [m.reasoning for m in store.messages(s.id)] == [None, "Three and three."]
    store.add_turn(s.id, "hi", "hello")  # a reply without thinking keeps none
    assert store.messages(s.id)[-1].reasoning is None
    with pytest.raises(StoreError, match="UTF-8"):
        store.add_turn(s.id, "x", "y", reasoning="\ud800")


def test_a_chat_database_of_the_first_schema_gains_the_thinking_column(db_path):
    """A chats.db written before replies kept their thinking opens, its chats whole."""
    conn = sqlite3.connect(db_path)
    conn.executescript(
        """CREATE TABLE sessions (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
               title TEXT, system_prompt TEXT, model TEXT, settings TEXT,
               created_at REAL NOT NULL, updated_at REAL NOT NULL);
           CREATE TABLE messages (id INTEGER PRIMARY KEY,
               session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
               seq INTEGER NOT NULL,
               role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
               content TEXT NOT NULL, stats TEXT, created_at REAL NOT NULL);
           CREATE UNIQUE INDEX messages_session_seq ON messages(session_id, seq);
           INSERT INTO sessions VALUES (1, 'old', 'Old', NULL, NULL, NULL, 1.0, 1.0);
           INSERT INTO messages VALUES (1, 1, 1, 'user', 'hi', NULL, 1.0);
           INSERT INTO messages VALUES (2, 1, 2, 'assistant', 'hello', NULL, 1.0);
           PRAGMA user_version = 1;"""
    )
    conn.close()
    with ChatStore(db_path) as store:
        assert [(m.content, m.reasoning) for m in store.messages(1)] == [
            ("hi", None),
            ("hello", None),
        ]
        store.add_turn(1, "and?", "fine", reasoning="hmm")
        assert store.messages(1)[-1].reasoning == "hmm"
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    conn.close()


# -- issue 45.4: branches and a regenerated reply's versions --


def test_a_chat_of_the_second_schema_gains_branches_and_versions_losing_nothing(db_path):
    with ChatStore(db_path) as store:
        chat = store.create_session("old", system_prompt="Be brief.", settings={"seed": 3})
        store.add_turn(chat.id, "hi", "hello", {"completion_tokens": 1}, reasoning="hmm")
    conn = sqlite3.connect(db_path)  # back to the schema of before: what an old chats.db is
    conn.executescript(
        """ALTER TABLE sessions DROP COLUMN fork_seq; ALTER TABLE sessions DROP COLUMN parent_id;
           ALTER TABLE messages DROP COLUMN versions; ALTER TABLE messages DROP COLUMN tool_steps;
           PRAGMA user_version = 2;"""
    )
    conn.close()
    with ChatStore(db_path) as store:
        session = store.get_session("old")
        assert session.system_prompt == "Be brief." and session.settings == {"seed": 3}
        assert session.parent_id is None and session.fork_seq is None
        messages = store.messages(session.id)
        assert [(m.role, m.content, m.reasoning, m.versions) for m in messages] == [
            ("user", "hi", None, ()),
            ("assistant", "hello", "hmm", ()),
        ]
        assert messages[1].stats == {"completion_tokens": 1}


def test_regenerating_keeps_the_earlier_replies_as_versions(store):
    chat = store.create_session("c")
    store.add_turn(chat.id, "hi", "one", {"completion_tokens": 1})
    store.replace_last_turn(chat.id, "hi", "two", {"completion_tokens": 2})
    _, reply = store.replace_last_turn(chat.id, "hi", "three", {"completion_tokens": 3})
    assert [v["content"] for v in reply.versions] == ["one", "two", "three"]
    assert reply.version == 2 and reply.content == "three"
    chosen = store.select_version(reply.id, 0)
    assert chosen.content == "one" and chosen.stats == {"completion_tokens": 1}
    assert chosen.version == 0 and len(chosen.versions) == 3
    assert store.messages(chat.id)[-1].content == "one"  # the chat goes on from it
    # an edit (another user message) is no version of the reply it replaces
    _, edited = store.replace_last_turn(chat.id, "hello", "four")
    assert edited.versions == () and edited.content == "four"
    with pytest.raises(StoreError):
        store.select_version(edited.id, 1)


def test_a_branch_shares_the_history_up_to_its_fork(store):
    chat = store.create_session("trip", system_prompt="Be brief.", settings={"temperature": 0.2})
    store.add_turn(chat.id, "one", "1")
    store.add_turn(chat.id, "two", "2")
    store.replace_last_turn(chat.id, "two", "2 again")
    branch = store.branch_session(chat.id, 3)  # one, 1, two
    assert branch.parent_id == chat.id and branch.fork_seq == 3
    assert branch.title == "↳ one" and branch.name != chat.name
    assert branch.system_prompt == "Be brief." and branch.settings == {"temperature": 0.2}
    assert [(m.role, m.content) for m in store.messages(branch.id)] == [
        ("user", "one"),
        ("assistant", "1"),
        ("user", "two"),
    ]
    store.add_turn(branch.id, "three", "3")  # the branch goes its own way
    assert len(store.messages(chat.id)) == 4 and len(store.messages(branch.id)) == 5
    whole = store.branch_session(chat.id, 4)
    assert [v["content"] for v in store.messages(whole.id)[-1].versions] == ["2", "2 again"]
    store.delete_session(chat.id)  # the branches stay, their parent gone
    assert store.get_session_by_id(branch.id).parent_id is None
    assert len(store.messages(branch.id)) == 5
