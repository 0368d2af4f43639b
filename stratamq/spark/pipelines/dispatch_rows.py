"""CommitLog records to what the store's dispatchers take from them, in bulk: the rebuild's map
side.

For a batch of record positions (``reading.walk_log_split``) this gives, without a Python step
per record, exactly what ``record.decode_dispatch_info`` gives the ConsumeQueue and index
dispatchers (``stratamq/store/dispatch.py``):

* ``units``: an Arrow batch, one row per record a ConsumeQueue takes (prepared and rolled-back
  transactional records dropped, as ``SysFlag.is_dispatchable``): topic, queue id, queue
  offset, physical offset, size, tags code (Java ``hashCode`` of ``TAGS``, once per distinct
  tag), store time;
* ``entries``: the index entries in the order ``IndexService`` writes them: per record that is
  not a rollback, its ``UNIQ_KEY`` then each non-empty word of ``KEYS``, hashed as
  ``abs(hashCode(topic#key))`` over UTF-16 units (``index_file.key_hash``).

Records of a deleted topic below its deletion offset (``config/deletedTopics.json``) are
passed over by every dispatcher, and here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratamq import record as codec
from stratamq.record import Prop, SysFlag
from stratamq.spark.rows import _properties, _spans
from stratamq.store.index_file import KEY_SEPARATOR, key_hash

UNIT_SCHEMA = pa.schema([
    ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("phys", pa.int64()), ("size", pa.int32()), ("tags_code", pa.int64()),
    ("store_ts", pa.int64()),
])  # fmt: skip

_INT_MAX = 0x7FFF_FFFF
_U32 = np.uint64(0xFFFF_FFFF)
_POW31: np.ndarray | None = None  # 31**k mod 2**32, k = 0, 1, ... (grown on demand)


class Entries(NamedTuple):
    """Index entries in write order: key hash, the record's physical offset and store time."""

    hash: np.ndarray  # int32
    phys: np.ndarray  # int64
    ts: np.ndarray  # int64

    @classmethod
    def empty(cls) -> Entries:
        return cls(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64))

    def __len__(self) -> int:
        return len(self.hash)

    def slice(self, start: int, stop: int) -> Entries:
        return Entries(self.hash[start:stop].copy(), self.phys[start:stop].copy(),
                       self.ts[start:stop].copy())

    @classmethod
    def concat(cls, parts: list[Entries]) -> Entries:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls._fields))


def dispatch_rows(buf, positions: Sequence[int], base: int, deleted: Mapping[str, int], *,
                  units: bool, entries: bool) -> tuple[pa.RecordBatch | None, Entries | None]:
    """The ConsumeQueue units and/or index entries of the records at ``positions`` of a
    segment buffer starting at CommitLog offset ``base``. Raises ``RecordCorrupt`` (position
    in the buffer) for a record whose fields do not add up."""
    f = codec.locate_fields(buf, positions, base)
    pbuf = pa.py_buffer(buf)
    topic_raw = _spans(pbuf, f["topic_start"], f["topic_length"], pa.binary())
    try:
        topic = topic_raw.cast(pa.string())
    except pa.ArrowInvalid:  # as decode_dispatch_info: bad bytes replaced
        topic = pa.array([t.decode("utf-8", "replace") for t in topic_raw.to_pylist()],
                         pa.string())
    props_raw = _spans(pbuf, f["props_start"], f["props_length"], pa.binary())
    try:
        props = _properties(props_raw)
    except pa.ArrowInvalid:  # not UTF-8: as decode_properties, bad bytes replaced
        props = pa.array([list(codec.decode_properties(p).items()) for p in
                          props_raw.to_pylist()], type=pa.map_(pa.string(), pa.string()))
    sys_flag = f["sys_flag"]
    phys = f["physical_offset"]
    live = np.ones(len(phys), dtype=bool)
    if deleted:
        encoded = pc.dictionary_encode(topic)
        cutoffs = np.array([deleted.get(t, -1) for t in encoded.dictionary.to_pylist()],
                           dtype=np.int64)
        live = phys >= cutoffs[encoded.indices.to_numpy()]
    kind = sys_flag & SysFlag.TRANSACTION_MASK
    out_units = None
    if units:
        keep = live & ((kind == SysFlag.TRANSACTION_NOT_TYPE)
                       | (kind == SysFlag.TRANSACTION_COMMIT_TYPE))
        tags = pc.map_lookup(props, Prop.TAGS, "last")
        out_units = pa.RecordBatch.from_arrays([
            topic, pa.array(f["queue_id"], pa.int32()), pa.array(f["queue_offset"], pa.int64()),
            pa.array(phys, pa.int64()), pa.array(f["total_size"], pa.int32()),
            pa.array(_tags_codes(tags), pa.int64()),
            pa.array(f["store_timestamp"], pa.int64())], schema=UNIT_SCHEMA)
        if not keep.all():
            out_units = out_units.filter(pa.array(keep))
    out_entries = None
    if entries:
        keep = live & (kind != SysFlag.TRANSACTION_ROLLBACK_TYPE)
        out_entries = _entries(topic, props, phys, f["store_timestamp"], keep)
    return out_units, out_entries


def _tags_codes(tags: pa.Array) -> np.ndarray:
    """``codec.tags_hash_code`` per row, computed once per distinct tag."""
    encoded = pc.dictionary_encode(tags)
    codes = np.array([codec.tags_hash_code(t) for t in encoded.dictionary.to_pylist()] or [0],
                     dtype=np.int64)
    indices = encoded.indices.fill_null(len(codes)).to_numpy(zero_copy_only=False)
    return np.append(codes, 0)[indices]  # a null tag (no TAGS) has code 0


def _entries(topic: pa.Array, props: pa.MapArray, phys: np.ndarray, ts: np.ndarray,
             keep: np.ndarray) -> Entries:
    """Per kept record: UNIQ_KEY, then each non-empty KEYS word; keys as ``topic#key``."""
    uniq = pc.map_lookup(props, Prop.UNIQ_KEY, "last")
    keys = pc.map_lookup(props, Prop.KEYS, "last")
    rows = np.flatnonzero(keep & pc.fill_null(pc.not_equal(uniq, ""), False)
                          .to_numpy(zero_copy_only=False))
    words = pc.split_pattern(keys, " ")
    word_rows = pc.list_parent_indices(words).to_numpy()
    flat = pc.list_flatten(words)
    # Position of each word within its record's list: order of the record's entries.
    starts = words.offsets.to_numpy()[:-1] - words.offsets[0].as_py()
    word_pos = np.arange(len(flat)) - starts[word_rows] if len(flat) else np.empty(0, np.int64)
    good = keep[word_rows] & (pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
                              if len(flat) else np.empty(0, bool))
    word_rows, word_pos, flat = word_rows[good], word_pos[good], flat.filter(pa.array(good))
    record = np.concatenate([rows, word_rows]).astype(np.int64)
    order_in_record = np.concatenate([np.zeros(len(rows), np.int64), word_pos + 1])
    key_text = pa.concat_arrays([uniq.take(pa.array(rows, pa.int64())).cast(pa.string()),
                                 flat.cast(pa.string())])
    prefixed = pc.binary_join_element_wise(topic.take(pa.array(record, pa.int64())), key_text,
                                           KEY_SEPARATOR)
    order = np.lexsort((order_in_record, record))
    hashes = key_hashes(prefixed)[order]
    rec = record[order]
    return Entries(hashes.astype(np.int32), phys[rec].astype(np.int64),
                   ts[rec].astype(np.int64))


def key_hashes(texts: pa.Array) -> np.ndarray:
    """``index_file.key_hash`` of each string, over the array's data buffer: Java's hashCode
    is ``sum(unit[i] * 31**(n-1-i)) mod 2**32``, done for ASCII keys with numpy in one pass.
    Keys with other characters (hashed over UTF-16 units) go one by one."""
    global _POW31
    n = len(texts)
    if n == 0:
        return np.empty(0, np.int64)
    texts = texts.cast(pa.large_string()) if texts.type != pa.large_string() else texts
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64, count=n + 1,
                            offset=texts.offset * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data_buf = texts.buffers()[2]
    data = (np.frombuffer(data_buf, dtype=np.uint8, count=hi)[lo:hi] if data_buf is not None
            else np.empty(0, np.uint8))
    lens = np.diff(offsets)
    longest = int(lens.max())
    if _POW31 is None or len(_POW31) < longest + 1:
        # uint64 products wrap mod 2**64, so their low 32 bits are exact mod 2**32.
        _POW31 = np.cumprod(np.concatenate([[1], np.full(max(longest, 1024), 31)])
                            .astype(np.uint64)) & _U32
    out = np.zeros(n, dtype=np.int64)
    ascii_rows = np.ones(n, dtype=bool)
    high = np.flatnonzero(data >= 0x80)
    if len(high):
        ascii_rows[np.unique(np.searchsorted(offsets - lo, high, side="right") - 1)] = False
    nonempty = lens > 0
    if len(data):
        ends = (offsets[1:] - lo).astype(np.int64)
        exponents = np.repeat(ends - 1, lens) - np.arange(len(data), dtype=np.int64)
        products = data.astype(np.uint64) * _POW31[exponents]
        starts = (offsets[:-1] - lo)[nonempty]
        sums = np.zeros(n, dtype=np.uint64)
        if len(starts):
            sums[nonempty] = np.add.reduceat(products, starts)
        signed = (sums & _U32).astype(np.uint32).view(np.int32).astype(np.int64)
        hashed = np.abs(signed)
        hashed[hashed > _INT_MAX] = 0  # abs(Integer.MIN_VALUE) stays negative in Java
        out = np.where(ascii_rows, hashed, 0)
    for row in np.flatnonzero(~ascii_rows).tolist():
        out[row] = key_hash(texts[row].as_py())
    return out
