"""Offline consistency check of a store: every record and every ConsumeQueue unit.

Records: every segment is scanned from the CommitLog's start with CRCs checked; only the last
segment may end in never-written space. Units: each must point at a record whose size, topic,
queue id, queue offset and tags code agree with it; and every consumable record must have
exactly one unit.
"""

from __future__ import annotations

from typing import Any

from stratamq import message as codec
from stratamq.message import RecordCorrupt, SysFlag, tags_hash_code
from stratamq.store.consume_queue_format import is_blank_unit
from stratamq.store.message_store import MessageStore
from stratamq.store.recovery import scan_segment

MAX_LISTED_PROBLEMS = 50


def verify_store(store: MessageStore) -> dict[str, Any]:
    problems: list[str] = []

    def problem(text: str) -> None:
        problems.append(text)

    files = store.commitlog.files.files
    records = 0
    consumable = 0
    scanned_bytes = 0
    for index, mf in enumerate(files):
        limit = mf.read_position
        scan = scan_segment(mf.buffer, mf.file_from_offset, limit, True)
        records += scan.records
        scanned_bytes += scan.valid_end
        last = index == len(files) - 1
        if scan.problem is not None and not (last and scan.valid_end == limit):
            problem(f"commitlog: {scan.problem}")
        elif not last and not scan.ended_with_blank:
            problem(f"commitlog: segment {mf.path.name} does not end with a blank record")
        pos = 0
        while pos < scan.valid_end:
            size, _ = codec.read_size_and_magic(mf.buffer, pos)
            info = codec.decode_dispatch_info(mf.buffer, pos)
            if SysFlag.is_dispatchable(info.sys_flag):
                consumable += 1
            pos += size

    units = 0
    queues = 0
    commitlog_min = store.commitlog.min_offset
    for cq in store.consume_queues:
        queues += 1
        start, end = cq.min_offset(), cq.max_offset()
        offset = start
        while offset < end:
            batch = cq.get_units(offset, 4096)
            if not batch:
                problem(f"consumequeue {cq.topic}/{cq.queue_id}: units missing at {offset}")
                break
            for queue_offset, (phys, size, code) in enumerate(batch, offset):
                if is_blank_unit(phys, size, code) or phys < commitlog_min:
                    continue
                units += 1
                where = f"consumequeue {cq.topic}/{cq.queue_id}@{queue_offset}"
                selected = store.commitlog.select(phys, size)
                if selected is None:
                    problem(f"{where}: no record of {size} bytes at commitlog offset {phys}")
                    continue
                mf, view = selected
                try:
                    codec.check_record(view, 0, size, phys, True)
                    info = codec.decode_dispatch_info(view, 0)
                except (RecordCorrupt, ValueError) as exc:
                    problem(f"{where}: bad record at {phys}: {exc}")
                    continue
                finally:
                    view.release()
                    mf.release()
                if (info.topic, info.queue_id, info.queue_offset, info.size) != (
                    cq.topic, cq.queue_id, queue_offset, size
                ):
                    problem(
                        f"{where}: record at {phys} is {info.topic}/{info.queue_id}"
                        f"@{info.queue_offset} ({info.size} bytes)"
                    )
                elif code != tags_hash_code(info.properties.get(codec.Prop.TAGS)):
                    problem(f"{where}: tags code {code} does not match the record's tags")
            offset += len(batch)
    if units != consumable:
        problem(f"{consumable} consumable records but {units} ConsumeQueue units")
    return {
        "ok": not problems,
        "store": str(store.layout.root),
        "recovery": store.recovery.as_dict() if store.recovery else None,
        "segments": len(files),
        "records": records,
        "consumable_records": consumable,
        "bytes": scanned_bytes,
        "queues": queues,
        "units": units,
        "problem_count": len(problems),
        "problems": problems[:MAX_LISTED_PROBLEMS],
    }
