"""What followed a run of tokens in the text a radix tree holds: drafts for speculative
decoding read from the cache (``core.engine.drafts``).

The tree holds every prompt and reply the engine cached. When a reply's last ``n`` tokens
also occur somewhere in that text, the tokens that followed them there are a good guess of
what comes next (an agent rewriting a file it was shown, a regenerated reply). This module
indexes, per namespace, every ``n``-token run of the tree's edges to the place right after
it, and reads a continuation from there: along the edge, then down the most recently used
child at each branch. It reads only the asked namespace's paths: one client's text is never
offered as another's draft.

The index is built when first asked for a namespace and again after the tree changed
(``RadixCache.version``: an edge added, split or dropped); between changes a lookup is a
dictionary read. Engine thread only, like the tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcache.radix_cache import RadixCache, TreeNode

NGRAM = 3  # tokens matched: fewer match by chance in text that does not repeat


class Continuations:
    """Continuations of token runs in one radix tree, by namespace."""

    def __init__(self, tree: RadixCache, ngram: int = NGRAM):
        if ngram < 1:
            raise ValueError("an n-gram has at least one token")
        self.tree = tree
        self.ngram = ngram
        # namespace -> (tree version it was built at, n-gram -> (node, offset after it))
        self._index: dict[str, tuple[int, dict[tuple[int, ...], tuple[TreeNode, int]]]] = {}

    def follow(self, context: Sequence[int], limit: int, namespace: str = "") -> list[int]:
        """Up to ``limit`` tokens that followed ``context``'s last ``ngram`` tokens in
        ``namespace``'s cached text (the most recently cached occurrence); [] if none."""
        if limit < 1 or len(context) < self.ngram:
            return []
        found = self._built(namespace).get(tuple(context[-self.ngram :]))
        if found is None:
            return []
        node, offset = found
        out: list[int] = []
        while len(out) < limit:
            out.extend(node.key[offset : offset + limit - len(out)])
            if not node.children:
                break
            node = max(node.children.values(), key=lambda child: child.last_access)
            offset = 0
        return out

    def _built(self, namespace: str) -> dict[tuple[int, ...], tuple[TreeNode, int]]:
        held = self._index.get(namespace)
        if held is not None and held[0] == self.tree.version:
            return held[1]
        index: dict[tuple[int, ...], tuple[TreeNode, int]] = {}
        top = self.tree.namespace_top(namespace)
        if top is not None and not self.tree.disable:
            # (node, the last ngram - 1 tokens before its edge); older paths first, so the
            # most recently used occurrence of a run is the one kept
            stack = [(child, ()) for child in _by_age(top)]
            n = self.ngram
            while stack:
                node, before = stack.pop()
                text = before + node.key
                for end in range(max(n, len(before) + 1), len(text) + 1):
                    if end - len(before) < len(node.key):  # a token follows on this edge
                        index[text[end - n : end]] = (node, end - len(before))
                    elif node.children:  # the run ends the edge: the children follow it
                        index[text[end - n : end]] = (node, len(node.key))
                tail = text[-(n - 1) :] if n > 1 else ()
                stack.extend((child, tail) for child in _by_age(node))
        self._index[namespace] = (self.tree.version, index)
        return index


def _by_age(node: TreeNode) -> list[TreeNode]:
    """``node``'s children, most recently used first (a stack pops it last)."""
    return sorted(node.children.values(), key=lambda child: child.last_access, reverse=True)
