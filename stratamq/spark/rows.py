"""CommitLog records to Arrow record batches: the row shape of the ``stratamq`` data source.

Record bytes are read only through ``stratamq.record`` (``walk_records`` finds records,
``locate_fields`` returns their header fields and the spans of body, topic and properties);
this module turns those spans into Arrow columns without a Python loop per row, which is what
lets one Spark task decode well over a million records a second:

* bodies, topics and property strings: one Arrow binary array over the mapped segment whose
  offsets alternate "field, gap to the next field", then ``take`` of the even elements (one
  copy, done in C++);
* properties: the ``\\x02`` and ``\\x01`` separators of every row found at once with numpy in
  the gathered property bytes, names and values gathered like bodies, then ``map<string,string>``
  from the per-row pair counts (``tags`` and ``keys`` are map lookups on it);
* hosts and message ids: formatted once per distinct store/born host, then gathered.

Only rows whose records need per-row work (IPv6 hosts, compressed bodies) are handled
one by one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratamq import record as codec
from stratamq.record import Host, Prop, SysFlag


def spark_schema(headers: bool = False):  # -> StructType (imported lazily: workers need no JVM)
    """The rows of the ``stratamq`` source, as Spark sees them; with ``headers`` (option
    ``includeHeaders``) a spark-sql-kafka ``headers`` column too."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    s, i, lg, ts = StringType(), IntegerType(), LongType(), TimestampType()
    extra = [StructField("headers", ArrayType(StructType([
        StructField("key", s), StructField("value", BinaryType())])))] if headers else []
    return StructType([*(StructField(name, kind) for name, kind in (
        ("topic", s), ("queue_id", i), ("queue_offset", lg), ("commitlog_offset", lg),
        ("msg_id", s), ("tags", s), ("keys", s), ("properties", MapType(s, s)),
        ("body", BinaryType()), ("born_timestamp", ts), ("store_timestamp", ts),
        ("born_host", s), ("store_host", s), ("reconsume_times", i), ("sys_flag", i),
    )), *extra])  # fmt: skip


# What Spark's Python data source runner expects back (``to_arrow_schema(schema, "UTC")``).
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("commitlog_offset", pa.int64()), ("msg_id", pa.string()), ("tags", pa.string()),
    ("keys", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("born_timestamp", pa.timestamp("us", tz="UTC")),
    ("store_timestamp", pa.timestamp("us", tz="UTC")), ("born_host", pa.string()),
    ("store_host", pa.string()), ("reconsume_times", pa.int32()), ("sys_flag", pa.int32()),
])  # fmt: skip

# A byte's two hex digits, high digit first in memory (little-endian uint16: low byte first).
_HEX_PAIRS = np.array([ord(f"{b:02X}"[0]) | ord(f"{b:02X}"[1]) << 8 for b in range(256)],
                      dtype="<u2")
_NOT_MESSAGES = (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE)


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def _spans(buf: pa.Buffer, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """Copy the byte ranges ``[start, start + length)`` of ``buf`` into one Arrow array."""
    n = len(starts)
    if n == 0:
        return pa.array([], type=kind)
    base = int(starts.min())
    rel = starts - base
    offsets = np.empty(2 * n, dtype=np.int64)
    offsets[0::2] = rel
    offsets[1::2] = rel + lengths
    if not np.all(offsets[1:] >= offsets[:-1]):  # spans out of order (ConsumeQueue reads)
        order = np.argsort(starts, kind="stable")
        out = _spans(buf, starts[order], lengths[order], kind)
        return out.take(pa.array(np.argsort(order, kind="stable")))
    top = int(offsets[-1])
    window = buf.slice(base, top)
    large = top > 0x7FFF_FFFF
    offsets_type = np.int64 if large else np.int32
    interleaved = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(), 2 * n - 1,
        [None, pa.py_buffer(offsets.astype(offsets_type)), window],
    )
    taken = interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    if large:
        taken = taken.cast(pa.binary())
    if kind == pa.string():
        return taken.cast(pa.string())  # validates UTF-8; raises on invalid bytes
    return taken


def _properties(raw: pa.Array) -> pa.MapArray:
    """``name\x01value\x02...`` strings to a map column, for all rows at once.

    The separators are found with numpy in the column's one data buffer; an item is the bytes
    between two ``\x02`` (or a row's ends), split at its first ``\x01``; items without one
    (empty ones included) are dropped, as ``message.decode_properties`` drops them. Raises
    ``pa.ArrowInvalid`` if a name or value is not UTF-8.
    """
    n = len(raw)
    # Absolute positions in the data buffer (``raw`` may be a slice: start at its offset).
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32, count=n + 1,
                            offset=raw.offset * 4).astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data_buf = raw.buffers()[2]
    data = (np.frombuffer(data_buf, dtype=np.uint8, count=hi) if data_buf is not None and hi
            else np.empty(0, dtype=np.uint8))
    window = data[lo:hi]
    seps = np.flatnonzero(window == 2) + lo
    ones = np.flatnonzero(window == 1) + lo
    buf = data_buf if data_buf is not None else pa.py_buffer(b"")
    if _regular(data, offsets, seps, ones):
        # Every item is ``name\x01value\x02`` (what RocketMQ writes): item k is the bytes from
        # the \x02 before it to seps[k], and the map's offsets are counts of \x02 before each
        # row's start. No sort, no per-item search.
        starts = np.empty(len(seps), dtype=np.int64)
        starts[:1] = lo
        starts[1:] = seps[:-1] + 1
        map_offsets = np.searchsorted(seps, offsets).astype(np.int32)
        names = _spans(buf, starts, ones - starts, pa.string())
        values = _spans(buf, ones + 1, seps - ones - 1, pa.string())
        return pa.MapArray.from_arrays(pa.array(map_offsets), names, values)
    # Items are disjoint and in order, so sorted starts and sorted ends pair up.
    starts = np.sort(np.concatenate([offsets[:-1], seps + 1]), kind="stable")
    ends = np.sort(np.concatenate([seps, offsets[1:]]), kind="stable")
    # The first \x01 at or after each item's start (``hi``, past every item, if none).
    split_at = np.append(ones, hi)[np.searchsorted(ones, starts)]
    keep = split_at < ends
    starts, ends, split_at = starts[keep], ends[keep], split_at[keep]
    rows = np.searchsorted(offsets, starts, side="right") - 1
    counts = np.bincount(rows, minlength=n)
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=map_offsets[1:])
    names = _spans(buf, starts, split_at - starts, pa.string())
    values = _spans(buf, split_at + 1, ends - split_at - 1, pa.string())
    return pa.MapArray.from_arrays(pa.array(map_offsets), names, values)


def _regular(data: np.ndarray, offsets: np.ndarray, seps: np.ndarray, ones: np.ndarray) -> bool:
    """Whether every row's properties are whole ``name\x01value\x02`` items: one \x01 between
    consecutive \x02, and each non-empty row ending in \x02 (so no item spans two rows)."""
    if len(seps) != len(ones) or not len(seps):
        return False
    if not ((ones < seps).all() and (ones[1:] > seps[:-1]).all() and ones[0] >= offsets[0]):
        return False
    ends = offsets[1:][offsets[1:] > offsets[:-1]]
    return bool((data[ends - 1] == 2).all())


def _host_strings(ips: np.ndarray, ports: np.ndarray) -> pa.Array:
    """"ip:port" per row for IPv4 hosts: formatted once per distinct host."""
    uniq, inverse = _distinct_hosts(ips, ports)
    return pa.array([str(_host(k)) for k in uniq.tolist()]).take(pa.array(inverse))


def _distinct_hosts(ips: np.ndarray, ports: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct hosts (packed as ``ip << 32 | port``) and each row's index into them. Rows
    of one segment nearly always share one host: that case skips the sort."""
    key = (ips.astype(np.uint64) << np.uint64(32)) | ports.astype(np.uint32).astype(np.uint64)
    if not len(key) or (key == key[0]).all():
        return key[:1], np.zeros(len(key), dtype=np.intp)
    return np.unique(key, return_inverse=True)


def _host(key: int) -> Host:
    """The host packed as ``ip << 32 | port`` (port as the record's unsigned bits)."""
    port = key & 0xFFFFFFFF
    return Host(str(ipaddress.IPv4Address(key >> 32)), port - (1 << 32) if port >> 31 else port)


def _msg_ids(store_ips: np.ndarray, store_ports: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Offset message ids for IPv4 store hosts: the host part via ``codec.offset_msg_id`` once
    per distinct host, the offset part hex-encoded in bulk (two digits per byte from a table:
    one gather, where a shift and a mask per digit cost three times as much)."""
    n = len(offsets)
    uniq, inverse = _distinct_hosts(store_ips, store_ports)
    prefixes = []
    for k in uniq.tolist():
        prefix = codec.offset_msg_id(_host(k), 0)[:-16]  # the offset is the last 16 hex digits
        prefixes.append(np.frombuffer(prefix.encode(), dtype=np.uint8))
    width = len(prefixes[0]) + 16
    chars = np.empty((n, width), dtype=np.uint8)
    chars[:, : width - 16] = prefixes[0] if len(prefixes) == 1 else np.stack(prefixes)[inverse]
    raw = offsets.astype(">u8").view(np.uint8).reshape(n, 8)
    chars[:, width - 16 :] = _HEX_PAIRS[raw].view(np.uint8).reshape(n, 16)
    value_offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(value_offsets),
                                                  pa.py_buffer(chars)])


def _inflate(body: pa.Buffer, sys_flag: int, position: int) -> bytes:
    """A compressed body inflated; a RecordCorrupt naming the record's ``position`` (in the
    buffer) if it does not inflate or names an unknown compression."""
    try:
        return codec.decompress_body(body, sys_flag)
    except Exception as exc:  # zlib.error, zstd / lz4 errors, ValueError for unknown bits
        raise codec.RecordCorrupt(position, f"its compressed body does not inflate: "
                                  f"{type(exc).__name__}: {exc}") from None


def records_to_batch(buf, positions: Sequence[int], file_from_offset: int) -> pa.RecordBatch:
    """One Arrow batch of the messages starting at ``positions`` of a segment buffer.

    Prepared and rolled-back transactional records are not messages and are dropped, as the
    dispatcher drops them. Compressed bodies are returned inflated.
    """
    if not len(positions):
        return empty_batch()
    f = codec.locate_fields(buf, positions, file_from_offset)
    sys_flag = f["sys_flag"]
    keep = ~np.isin(sys_flag & SysFlag.TRANSACTION_MASK, _NOT_MESSAGES)
    if not keep.all():
        rows = np.flatnonzero(keep)
        if not len(rows):
            return empty_batch()
        v6 = f["v6_hosts"]
        f = {k: (v[rows] if isinstance(v, np.ndarray) else v) for k, v in f.items()}
        f["v6_hosts"] = {new: v6[old] for new, old in enumerate(rows.tolist()) if old in v6}
        sys_flag = f["sys_flag"]
    n = len(sys_flag)
    pbuf = pa.py_buffer(buf)
    body = _spans(pbuf, f["body_start"], f["body_length"], pa.binary())
    topic = _spans(pbuf, f["topic_start"], f["topic_length"], pa.string())
    props_raw = _spans(pbuf, f["props_start"], f["props_length"], pa.binary())
    try:
        props = _properties(props_raw)
    except pa.ArrowInvalid:  # not UTF-8: decode row by row, replacing bad bytes
        props = pa.array([list(codec.decode_properties(p).items()) for p in
                          props_raw.to_pylist()], type=pa.map_(pa.string(), pa.string()))
    v6 = f["v6_hosts"]
    if v6:
        born_host = pa.array([str(v6[i][0]) if i in v6 else None for i in range(n)])
        store_host = pa.array([str(v6[i][1]) if i in v6 else None for i in range(n)])
        born_v4 = _host_strings(f["born_host_ip"], f["born_host_port"])
        store_v4 = _host_strings(f["store_host_ip"], f["store_host_port"])
        is_v6 = pa.array([i in v6 for i in range(n)])
        born_host = pc.if_else(is_v6, born_host, born_v4)
        store_host = pc.if_else(is_v6, store_host, store_v4)
        msg_id = pa.array([
            codec.offset_msg_id(v6[i][1], int(f["physical_offset"][i])) if i in v6 else None
            for i in range(n)])
        msg_id = pc.if_else(is_v6, msg_id, _msg_ids(f["store_host_ip"], f["store_host_port"],
                                                     f["physical_offset"]))
    else:
        born_host = _host_strings(f["born_host_ip"], f["born_host_port"])
        store_host = _host_strings(f["store_host_ip"], f["store_host_port"])
        msg_id = _msg_ids(f["store_host_ip"], f["store_host_port"], f["physical_offset"])
    compressed = np.flatnonzero(sys_flag & SysFlag.COMPRESSED)
    if len(compressed):  # inflate just those rows; the others stay as gathered
        inflated = [_inflate(body[i].as_buffer(), int(sys_flag[i]),
                             int(f["physical_offset"][i]) - file_from_offset)
                    for i in compressed.tolist()]
        mask = np.zeros(n, dtype=bool)
        mask[compressed] = True
        body = pc.replace_with_mask(body, pa.array(mask), pa.array(inflated, pa.binary()))
    ts = pa.timestamp("us", tz="UTC")
    columns = [
        topic, pa.array(f["queue_id"], pa.int32()), pa.array(f["queue_offset"], pa.int64()),
        pa.array(f["physical_offset"], pa.int64()), msg_id,
        pc.map_lookup(props, Prop.TAGS, "last"), pc.map_lookup(props, Prop.KEYS, "last"),
        props, body, pa.array(f["born_timestamp"] * 1000, ts),
        pa.array(f["store_timestamp"] * 1000, ts), born_host, store_host,
        pa.array(f["reconsume_times"], pa.int32()), pa.array(sys_flag, pa.int32()),
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def with_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` plus spark-sql-kafka's ``headers`` column (key STRING, value BINARY per
    property), built from the ``properties`` map without a per-row loop."""
    props = batch.column("properties")
    entries = pa.StructArray.from_arrays(
        [props.keys, props.items.cast(pa.binary())], names=["key", "value"])
    headers = pa.ListArray.from_arrays(props.offsets, entries, type=HEADER_TYPE,
                                       mask=props.is_null())
    return pa.RecordBatch.from_arrays([*batch.columns, headers],
                                      schema=batch.schema.append(pa.field("headers", HEADER_TYPE)))
