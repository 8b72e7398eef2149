"""Every token the scheduler takes for each request, as it takes them.

Replies compared by their text can hide a difference: a tiny model's random bytes decode
to replacement characters, and a token may decode to nothing. Tests that compare greedy
replies computed along different paths (cached or not, batched or alone, sped up or not)
compare these token ids, one by one."""

from __future__ import annotations

from core.engine.replies import Finisher


class TokenLog:
    """Records, through ``monkeypatch``, each token ``Finisher.take`` is given (the
    scheduler's replies), by request handle (the engine thread appends; read once a request
    is done)."""

    def __init__(self, monkeypatch):
        self._by_handle: dict[int, tuple[object, list[int]]] = {}
        take = Finisher.take

        def recording(finisher, state, token):
            self._by_handle.setdefault(id(state.handle), (state.handle, []))[1].append(token)
            return take(finisher, state, token)

        monkeypatch.setattr(Finisher, "take", recording)

    def of(self, handle) -> list[int]:
        """The tokens of the request ``handle`` carries (the end-of-sequence one included)."""
        return list(self._by_handle[id(handle)][1])

    def started(self) -> list[list[int]]:
        """Every request's tokens, in the order their first tokens came."""
        return [list(tokens) for _, tokens in self._by_handle.values()]

    def by_prompt(self) -> dict[str, list[int]]:
        """The tokens of each request since the last :meth:`clear`, by its prompt text (for
        requests made with ``prompt_text``, each its own)."""
        found: dict[str, list[int]] = {}
        for handle, tokens in self._by_handle.values():
            assert handle.request.prompt_text not in found, "two requests with one prompt"
            found[handle.request.prompt_text] = list(tokens)
        return found

    def clear(self) -> None:
        self._by_handle.clear()
