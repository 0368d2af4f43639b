"""Consistency checks of a store: ``stratamq store verify`` and the read-only commands' warnings.

``verify_store`` runs on a store opened read-write (whose open has already recovered it):

1. Repairs what can be rebuilt from the CommitLog without losing anything: ConsumeQueue units
   the queues lack (a queue's files removed, a dispatcher that fell behind) and index entries no
   index file holds (index files removed or unreadable).
2. Checks every record (CRCs included; a segment other than the last must end with a blank
   record) and every ConsumeQueue unit (it must point at a record whose size, topic, queue id,
   queue offset and tags code agree with it); every consumable record must have exactly one
   unit, queue by queue, and every record with keys must be in an index file.
3. Says what recovery threw away: a cut with valid records behind it, or dispatched messages
   whose units it dropped, is data loss, not a torn tail.

The summary's ``ok`` is false when a check fails or data was lost; what was repaired is listed
under ``repaired``. The read-only helpers (``scan_undispatched``, ``index_gaps``,
``record_problem_at``) let ``dump``, ``stat`` and ``query`` say what they cannot show.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stratamq import record as codec
from stratamq.record import RecordCorrupt, SysFlag, tags_hash_code
from stratamq.store.consume_queue_format import is_blank_unit
from stratamq.store.index_service import IndexService
from stratamq.store.inspect import (
    MAX_LISTED_PROBLEMS,
    MAX_LISTED_QUEUES,
    NotEnoughSpace,
    QueueKey,
    _resync,
    index_gaps,
    index_spans,
    is_indexed_record,
    queue_name,
    rebuild_index,
    scan_undispatched,
)
from stratamq.store.parts import StoreParts

# (phase, done, total): how far a long check is, for a progress display.
Progress = Callable[[str, int, int], None]


@dataclass
class _LogFacts:
    records: int = 0
    record_bytes: int = 0
    corrupt: int = 0
    consumable: Counter[QueueKey] = field(default_factory=Counter)
    keyed_unindexed: int = 0
    first_unindexed: int | None = None


def _check_log(store: StoreParts, index_files: list | None,
               problem: Callable[[str], None], progress: Progress | None = None) -> _LogFacts:
    """Scan every record from the CommitLog's start with CRCs checked, past damage too."""
    facts = _LogFacts()
    files = store.commitlog.files.files
    spans = index_spans(index_files) if index_files is not None else None
    span_at = 0
    first = store.commitlog.min_offset
    for number, mf in enumerate(files):
        if progress is not None:
            progress("checking CommitLog records", mf.file_from_offset - first,
                     store.commitlog.max_offset - first)
        buf, base, limit = mf.buffer, mf.file_from_offset, mf.read_position
        last = number == len(files) - 1
        pos = 0
        ended_with_blank = False
        while True:
            scan = codec.scan_records(buf, pos, limit, base, True)
            p = pos
            while p < scan.end:
                size, _ = codec.read_size_and_magic(buf, p)
                info = codec.decode_dispatch_info(buf, p)
                if SysFlag.is_dispatchable(info.sys_flag):
                    facts.consumable[(info.topic, info.queue_id)] += 1
                if spans is not None and is_indexed_record(info):
                    phys = base + p
                    while span_at < len(spans) and spans[span_at][1] < phys:
                        span_at += 1
                    if span_at == len(spans) or spans[span_at][0] > phys:
                        facts.keyed_unindexed += 1
                        if facts.first_unindexed is None:
                            facts.first_unindexed = phys
                facts.record_bytes += size
                p += size
            facts.records += scan.records
            if scan.blank:
                ended_with_blank = True
                break
            if scan.end + 8 > limit:
                break  # the end of what the segment holds
            facts.corrupt += 1
            reason = scan.problem or RecordCorrupt(base + scan.end,
                                                   "zero bytes where a record should be")
            nxt = _resync(mf, scan.end + 1, limit)
            after = (f"; valid records resume at {base + nxt}" if nxt is not None
                     else "; no valid record after it in this segment")
            problem(f"commitlog: {reason}{after}")
            if nxt is None:
                break
            pos = nxt
        if not last and not ended_with_blank:
            problem(f"commitlog: segment {mf.path.name} does not end with a blank record")
    return facts


def _check_units(store: StoreParts, problem: Callable[[str], None],
                 progress: Progress | None = None) -> Counter[QueueKey]:
    units: Counter[QueueKey] = Counter()
    commitlog_min = store.commitlog.min_offset
    queues = list(store.consume_queues)
    for number, cq in enumerate(queues):
        if progress is not None:
            progress("checking ConsumeQueue units", number, len(queues))
        key = (cq.topic, cq.queue_id)
        units[key] += 0
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
                    reason = exc.reason if isinstance(exc, RecordCorrupt) else str(exc)
                    problem(f"{where}: bad record at commitlog offset {phys}: {reason}")
                    continue
                finally:
                    view.release()
                    mf.release()
                # Counted only when its record is sound: a damaged one is reported above, and
                # the per-queue count below then compares units with the sound records.
                units[key] += 1
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
    return units


def _loss(store: StoreParts, problem: Callable[[str], None]) -> dict[str, Any] | None:
    """What this open's recovery threw away, if more than a torn tail."""
    rec = store.recovery
    if rec is None or not rec.lost_data:
        return None
    if rec.records_after_cut:
        problem(f"commitlog: recovery cut the log at {rec.end_offset} ({rec.problem}); "
                f"{rec.records_after_cut} valid records after the cut (the first at "
                f"{rec.first_record_after_cut}) are lost"
                + (f"; segments deleted whole: {', '.join(rec.deleted_segments)}"
                   if rec.deleted_segments else ""))
    if rec.dropped_units:
        problem(f"consumequeue: recovery dropped {rec.dropped_units} units of dispatched "
                f"messages whose records lay past the cut at {rec.end_offset}")
    return {
        "cut_offset": rec.end_offset,
        "reason": rec.problem,
        "records_after_cut": rec.records_after_cut,
        "first_record_after_cut": rec.first_record_after_cut,
        "dropped_units": rec.dropped_units,
        "deleted_segments": rec.deleted_segments,
    }




def verify_store(store: StoreParts, progress: Progress | None = None) -> dict[str, Any]:
    """Repair what the CommitLog can rebuild, then check everything (module docstring).

    ``store`` must be open read-write with nothing else using it: its dispatcher and clean-up
    service are stopped here so the repairs run on this thread alone and no file is deleted
    under the check. A read-only store is only checked."""
    problems: list[str] = []
    repaired: list[str] = []

    def problem(text: str) -> None:
        problems.append(text)

    data_loss = _loss(store, problem)
    index = store.index
    fresh_index: IndexService | None = None
    index_summary: dict[str, Any] | None = None
    try:
        if not store.read_only:
            store.quiesce()  # repairs run alone; no file may be deleted under the check
            missing = scan_undispatched(store, redispatch=True)
            if missing.records:
                repaired.append(f"re-dispatched {missing.records} records that no ConsumeQueue "
                                f"held ({missing.queues_text()})")
        if index is not None:
            index_summary = {}
            if index.dropped and not store.read_only:
                repaired.append("rebuilt untrusted index files from the CommitLog: " + "; ".join(
                    f"{name} ({why})" for name, why in index.dropped))
            gaps = [] if store.read_only else index_gaps(store)
            if gaps:
                missing_keys = sum(g.records for g in gaps)
                try:
                    fresh_index, rebuilt = rebuild_index(store, gaps)
                except NotEnoughSpace as exc:
                    problem(f"index not repaired: {exc}")
                    gaps = []
            if gaps:
                index_summary["rebuilt"] = rebuilt
                repaired.append(
                    f"{missing_keys} records with keys were in no index file (the first at "
                    f"{gaps[0].first}); re-indexed {rebuilt['records']} records from there"
                    + (f", replacing {', '.join(rebuilt['removed_files'])}"
                       if rebuilt["removed_files"] else ""))
            index_files = (fresh_index or index).files()
            index_summary["files"] = len(index_files)
        else:
            index_files = None

        facts = _check_log(store, index_files, problem, progress)
        units = _check_units(store, problem, progress)
        consumable = sum(facts.consumable.values())
        unit_count = sum(units.values())
        if units != facts.consumable:
            differ = sorted(k for k in facts.consumable.keys() | units.keys()
                            if facts.consumable[k] != units[k])
            listed = ", ".join(f"{queue_name(k)} ({facts.consumable[k]} records, "
                               f"{units[k]} units)" for k in differ[:MAX_LISTED_QUEUES])
            more = len(differ) - MAX_LISTED_QUEUES
            problem(f"{consumable} consumable records but {unit_count} ConsumeQueue units; "
                    f"queues that differ: {listed}" + (f", and {more} more" if more > 0 else ""))
        if index_summary is not None:
            index_summary["unindexed_records"] = facts.keyed_unindexed
            if facts.keyed_unindexed:
                problem(f"index: {facts.keyed_unindexed} records with keys are in no index file "
                        f"(the first at {facts.first_unindexed})")
    finally:
        if fresh_index is not None:
            fresh_index.close()
    return {
        "ok": not problems,
        "store": str(store.layout.root),
        "recovery": store.recovery.as_dict() if store.recovery else None,
        "data_loss": data_loss,
        "repaired": repaired,
        "segments": len(store.commitlog.files.files),
        "records": facts.records,
        "corrupt_records": facts.corrupt,
        "consumable_records": consumable,
        "bytes": facts.record_bytes,
        "queues": len(units),
        "units": unit_count,
        "index": index_summary,
        "problem_count": len(problems),
        "problems": problems[:MAX_LISTED_PROBLEMS],
    }
