"""Which broker of a group becomes its master: RocketMQ's controller ``DefaultElectPolicy``.

Pure: given what the group's live brokers registered (epoch, max offset, priority), the
SyncStateSet and the old master, ``elect`` returns the broker id to elect, or None.

RocketMQ's rules, in order (``DefaultElectPolicy.elect``/``tryElect``, and
``ReplicasInfoManager.electMaster`` passing all replicas only with
``enableElectUncleanMaster``):

1. Candidates are the live members of the SyncStateSet; only when none is alive, and only
   with ``enableElectUncleanMaster``, every live broker of the group (an unclean election:
   messages the old master acknowledged may be missing from the new one).
2. The old master, if it is a candidate and no broker is preferred, stays master.
3. A preferred broker (``cluster elect --broker-id N``, RocketMQ's ``electMaster -i``) is
   elected if it is a candidate, else nobody is from that set.
4. Otherwise the highest epoch wins, then the highest max offset, then the lowest
   ``brokerElectionPriority``; StrataMQ breaks a remaining tie by the lowest broker id (RocketMQ
   takes whichever its TreeSet keeps), so every broker computing this agrees.

An empty SyncStateSet (a group that never had a master) counts every live broker as in it,
as RocketMQ's first election takes the first broker to register.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = ["Candidate", "Election", "elect"]


@dataclass(frozen=True)
class Candidate:
    broker_id: int
    epoch: int  # the last epoch in the broker's epoch file
    max_offset: int  # its CommitLog's max physical offset
    priority: int  # brokerElectionPriority: lower is preferred


@dataclass(frozen=True)
class Election:
    broker_id: int | None
    unclean: bool  # chosen outside the SyncStateSet


def _rank(c: Candidate) -> tuple[int, int, int, int]:
    return (-c.epoch, -c.max_offset, c.priority, c.broker_id)


def _try(candidates: list[Candidate], old_master: int | None, preferred: int | None
         ) -> int | None:
    if not candidates:
        return None
    ids = {c.broker_id for c in candidates}
    if old_master in ids and (preferred is None or preferred == old_master):
        return old_master
    if preferred is not None:
        return preferred if preferred in ids else None
    return min(candidates, key=_rank).broker_id


def elect(live: Mapping[int, Candidate], sync_state_set: Collection[int],
          old_master: int | None = None, preferred: int | None = None,
          allow_unclean: bool = False) -> Election:
    """The broker to elect among ``live`` (by id); see the module docstring."""
    in_set = [c for i, c in live.items() if not sync_state_set or i in sync_state_set]
    chosen = _try(in_set, old_master, preferred)
    if chosen is not None:
        return Election(chosen, unclean=False)
    if allow_unclean:
        chosen = _try(list(live.values()), old_master, preferred)
        if chosen is not None:
            return Election(chosen, unclean=bool(sync_state_set) and
                            chosen not in sync_state_set)
    return Election(None, unclean=False)
