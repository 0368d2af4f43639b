"""Tag filter expressions for reads: ``*`` (everything) or ``TagA || TagB``.

The ConsumeQueue unit carries the tags' Java hash code, so most non-matching messages are
skipped without touching the CommitLog; a hash hit is confirmed against the record's own tags.
"""

from __future__ import annotations

from stratamq.record import tags_hash_code


class TagFilter:
    def __init__(self, expression: str | None = None) -> None:
        self.expression = (expression or "*").strip() or "*"
        if self.expression == "*":
            self.tags: frozenset[str] | None = None
            self.codes: frozenset[int] = frozenset()
        else:
            tags = frozenset(t.strip() for t in self.expression.split("||") if t.strip())
            if not tags:
                raise ValueError(f"tag expression {expression!r} names no tag")
            self.tags = tags
            self.codes = frozenset(tags_hash_code(t) for t in tags)

    @property
    def accepts_all(self) -> bool:
        return self.tags is None

    def matches_code(self, code: int) -> bool:
        return self.tags is None or code in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        return self.tags is None or (tags is not None and tags in self.tags)

    def __repr__(self) -> str:
        return f"TagFilter({self.expression!r})"
