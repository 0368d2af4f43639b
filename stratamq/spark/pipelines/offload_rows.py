"""The offload's map side: CommitLog records to what the tier keeps of them, in bulk.

Per batch of record positions (``reading.walk_log_split``) a table with one row per message a
ConsumeQueue holds (``dispatch_rows``: prepared and rolled-back transactions and deleted
topics' old records left out), of the topics offloaded (tiered storage's topic filter applies:
system topics are never tiered):

    topic, queue_id, queue_offset, phys, size, tags_code, store_ts, keys[, record]

``keys`` are the index keys the tier's uploader gives a message: the distinct words of
``KEYS`` and its ``UNIQ_KEY``, sorted (a set in the uploader; sorted here so that a rerun
writes the same bytes). ``record`` (the write pass only) is the whole record, byte for byte.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratamq import record as codec
from stratamq.record import Prop
from stratamq.spark.pipelines.dispatch_rows import UNIT_SCHEMA, dispatch_rows, key_hashes
from stratamq.spark.rows import _properties, _spans
from stratamq.store.index_file import KEY_SEPARATOR

KEYS_TYPE = pa.list_(pa.string())


def offload_rows(buf, positions: Sequence[int], base: int, deleted: Mapping[str, int],
                 topics: Collection[str] | None, *, with_records: bool) -> pa.RecordBatch:
    """See the module docstring. ``topics``: the topics to keep (None: every topic the tier
    takes)."""
    from stratamq.tiered.uploader import is_filtered_topic

    units, _ = dispatch_rows(buf, positions, base, deleted, units=True, entries=False)
    assert units is not None
    names = pc.dictionary_encode(units.column("topic"))
    wanted = np.array([not is_filtered_topic(t) and (topics is None or t in topics)
                       for t in names.dictionary.to_pylist()] + [False], dtype=bool)
    keep = wanted[names.indices.fill_null(len(wanted) - 1).to_numpy(zero_copy_only=False)]
    units = units.filter(pa.array(keep)) if not keep.all() else units
    if not units.num_rows:
        return _empty(with_records)
    # The kept rows' records: start positions from the physical offsets.
    starts = units.column("phys").to_numpy() - base
    f = codec.locate_fields(buf, starts, base)
    pbuf = pa.py_buffer(buf)
    props_raw = _spans(pbuf, f["props_start"], f["props_length"], pa.binary())
    try:
        props = _properties(props_raw)
    except pa.ArrowInvalid:
        props = pa.array([list(codec.decode_properties(p).items()) for p in
                          props_raw.to_pylist()], type=pa.map_(pa.string(), pa.string()))
    columns = [*units.columns, _keys(props)]
    names_out = [*UNIT_SCHEMA.names, "keys"]
    if with_records:
        columns.append(_spans(pbuf, starts, units.column("size").to_numpy().astype(np.int64),
                              pa.binary()))
        names_out.append("record")
    return pa.RecordBatch.from_arrays(columns, names=names_out)


def _empty(with_records: bool) -> pa.RecordBatch:
    fields = [*UNIT_SCHEMA, pa.field("keys", KEYS_TYPE)]
    if with_records:
        fields.append(pa.field("record", pa.binary()))
    return pa.RecordBatch.from_pylist([], schema=pa.schema(fields))


def _keys(props: pa.MapArray) -> pa.ListArray:
    """Per row: sorted distinct words of KEYS (split on whitespace, as ``str.split()``) plus
    UNIQ_KEY when it is not empty.

    The (row, key) pairs are sorted (``sort_indices``) and equal neighbours dropped: half the
    CPU of a hash ``group_by`` then a sort (0.45 against 0.9 us a row, same process, A/B), and
    the offload runs this twice per record (read and write stages)."""
    keys = pc.map_lookup(props, Prop.KEYS, "last")
    uniq = pc.map_lookup(props, Prop.UNIQ_KEY, "last")
    n = len(props)
    words = pc.split_pattern_regex(pc.utf8_trim_whitespace(pc.fill_null(keys, "")), r"\s+")
    has_uniq = pc.fill_null(pc.not_equal(uniq, ""), False).to_numpy(zero_copy_only=False)
    uniq_rows = np.flatnonzero(has_uniq)
    rows = np.concatenate([pc.list_parent_indices(words).to_numpy(), uniq_rows]).astype(np.int64)
    found = pa.concat_arrays([pc.list_flatten(words).cast(pa.string()),
                              uniq.take(pa.array(uniq_rows, pa.int64())).cast(pa.string())])
    nonempty = pc.not_equal(found, "").to_numpy(zero_copy_only=False)
    if not nonempty.all():
        keep = np.flatnonzero(nonempty)
        rows, found = rows[keep], found.take(pa.array(keep))
    order = pc.sort_indices(pa.table({"row": rows, "key": found}),
                            sort_keys=[("row", "ascending"), ("key", "ascending")])
    rows, found = rows[order.to_numpy()], found.take(order)
    if len(found) > 1:  # a word twice in a row's KEYS, or its UNIQ_KEY among them
        same = (rows[1:] == rows[:-1]) & pc.equal(found[1:], found[:-1]).to_numpy(
            zero_copy_only=False)
        if same.any():
            keep = np.flatnonzero(np.concatenate([[True], ~same]))
            rows, found = rows[keep], found.take(pa.array(keep))
    counts = np.bincount(rows, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), found)


def key_hash_list(topics: pa.Array, keys: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each key, ``key_hash(topic#key)``) for every key of every row, in order."""
    rows = pc.list_parent_indices(keys).to_numpy()
    flat = pc.list_flatten(keys)
    if not len(flat):
        return rows.astype(np.int64), np.empty(0, np.int64)
    texts = pc.binary_join_element_wise(topics.take(pa.array(rows)), flat, KEY_SEPARATOR)
    return rows.astype(np.int64), key_hashes(texts)
