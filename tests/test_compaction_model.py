"""Random workloads against a dict model: puts, updates, deletes (both kinds of tombstone),
compaction rounds at moving times and restarts. Reading the queue from its start and applying
it as a consumer does always gives the model; after a round that covered everything, each key
appears once (its latest value, or its tombstone while delete.retention.ms runs)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from compaction_util import HOUR, as_table, close, compact, open_store, put, read_from, small_config
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from stratamq.compaction.offset_map import OffsetMap, digests_of

KEYS = st.sampled_from([f"key-{i}" for i in range(12)])


class CompactionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="compaction-model-"))
        # A small OffsetMap: rounds often stop part way (the incremental build).
        self.cfg = small_config(self.dir / "store", max_offset_map_size=24 * 1024,
                                compaction_thread_num=1)
        self.store, self.comp = open_store(self.cfg)
        self.model: dict[str, bytes] = {}
        self.now = 1_700_000_000_000
        self.counter = 0

    def teardown(self) -> None:
        close(self.store, self.comp)
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(key=KEYS, size=st.integers(1, 300))
    def put_value(self, key: str, size: int) -> None:
        self.counter += 1
        value = (b"%d:" % self.counter) * (size // 4 + 1)
        put(self.store, key, value[:size])
        self.model[key] = value[:size]

    @rule(key=KEYS, by_property=st.booleans())
    def delete(self, key: str, by_property: bool) -> None:
        if by_property:
            put(self.store, key, b"ignored body", TOMBSTONE="true")
        else:
            put(self.store, key, b"")
        self.model.pop(key, None)

    @rule(value=st.binary(min_size=1, max_size=20))
    def put_without_key(self, value: bytes) -> None:
        put(self.store, None, value)

    @rule(seal=st.booleans(), hours=st.sampled_from([0, 0, 0.5, 1, 2]))
    def compaction_round(self, seal: bool, hours: float) -> None:
        self.now += int(hours * HOUR)
        while True:  # as many rounds as a small OffsetMap needs to cover everything
            reports = compact(self.store, self.comp, seal=seal, now_ms=self.now)
            seal = False
            if not reports or reports[0].skipped or reports[0].cleaned_to >= \
                    self.store.get_max_offset_in_queue("Kv", 0):
                break

    @rule()
    def restart(self) -> None:
        close(self.store, self.comp)
        self.store, self.comp = open_store(self.cfg)

    @invariant()
    def reading_from_the_start_gives_the_model(self) -> None:
        assert as_table(read_from(self.store)) == self.model

    @precondition(lambda self: self.store.get_max_offset_in_queue("Kv", 0) > 0)
    @rule()
    def a_full_round_leaves_one_message_per_key(self) -> None:
        reports = compact(self.store, self.comp, now_ms=self.now)
        while reports[0].skipped is None and reports[0].cleaned_to < \
                self.store.get_max_offset_in_queue("Kv", 0):
            reports = compact(self.store, self.comp, now_ms=self.now, seal=False)
        messages = read_from(self.store)
        keys = [m.properties.get("KEYS") for m in messages]
        assert None not in keys  # keyless messages are gone
        assert len(keys) == len(set(keys))
        live = {m.properties["KEYS"] for m in messages
                if m.body and m.properties.get("TOMBSTONE") != "true"}
        assert live == set(self.model)
        tombstones = set(keys) - live
        assert tombstones.isdisjoint(self.model)


CompactionModel.TestCase.settings = settings(
    max_examples=20, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCompactionModel = CompactionModel.TestCase


class OffsetMapModel(RuleBasedStateMachine):
    """The OffsetMap against a dict: batches of puts (later offsets win), lookups of present
    and absent keys, and the refusal of new keys past its load factor."""

    def __init__(self) -> None:
        super().__init__()
        self.map = OffsetMap(24 * 400)  # 400 slots, 360 keys at most
        self.model: dict[str, int] = {}
        self.offset = 0
        self.full = False

    @rule(keys=st.lists(st.integers(0, 600).map(lambda i: f"k{i}"), min_size=1, max_size=200))
    def put_batch(self, keys: list[str]) -> None:
        import numpy as np

        offsets = np.arange(self.offset, self.offset + len(keys))
        self.offset += len(keys)
        took = self.map.put_many(digests_of(keys), offsets)
        for key, offset in zip(keys[:took], offsets[:took]):
            self.model[key] = int(offset)
        if took < len(keys):
            # It stopped at a key it does not hold, because holding it would pass 90 %.
            assert keys[took] not in self.model
            assert len(self.model) == self.map.max_entries

    @invariant()
    def lookups_agree(self) -> None:
        assert self.map.size == len(self.model) <= self.map.max_entries
        if self.model:
            got = self.map.get_many(digests_of(list(self.model)))
            assert got.tolist() == list(self.model.values())
        assert self.map.get_many(digests_of(["absent-a", "absent-b"])).tolist() == [-1, -1]


OffsetMapModel.TestCase.settings = settings(max_examples=50, stateful_step_count=20,
                                            deadline=None)
TestOffsetMapModel = OffsetMapModel.TestCase
