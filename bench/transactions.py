"""Transactional messages benchmark: a broker subprocess and the official Python client.

    python bench/transactions.py [--quick] [--messages N] [--rounds R] [--open-halves H]

Prints one JSON object per line:

* ``env``: interpreter, CPUs, the settings of the run.
* ``send_commit``: per round, plain sends (one SendMessage each, a NORMAL topic) and
  transactional sends each committed at once (SendMessage of a half, then EndTransaction COMMIT,
  a TRANSACTION topic), one at a time from one producer; the rounds alternate the two, so a
  noisy neighbour hits both. msgs/s each and their ratio (transactional over plain; the
  issue's target is >= 0.4), medians over the rounds.
* ``check_back``: ``--open-halves`` half messages left open by a producer that went away; a
  producer with a ``TransactionChecker`` answering COMMIT then connects, and the time from the
  round's first check to no transaction open (every half checked back and committed, as
  ``stratamq transaction list`` shows) gives the check-back rate, checks/s. The check interval
  is RocketMQ's default (30 s), so waiting for the round is not counted.

Everything runs on this machine (the broker, the client), so figures are relative; the official
client's own cost per RPC dominates both send figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from broker_proc import start_broker  # noqa: E402

PLAIN, TXN = "BenchPlain", "BenchTx"


def _emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def _config(endpoint: str):
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(endpoint, Credentials(), request_timeout=30)


def _message(topic: str, body: bytes):
    from rocketmq import Message

    m = Message()
    m.topic, m.body = topic, body
    return m


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def send_commit(endpoint: str, messages: int, rounds: int) -> None:
    from rocketmq import Producer
    from rocketmq.v5.producer import TransactionChecker

    class Never(TransactionChecker):
        def check(self, message):  # every transaction is ended by its producer here
            from rocketmq.grpc_protocol import definition_pb2 as pb

            return pb.COMMIT

    producer = Producer(_config(endpoint), (PLAIN, TXN), Never())
    producer.startup()
    body = os.urandom(1024)
    producer.send(_message(PLAIN, body))  # channel set-up, not measured
    txn = producer.begin_transaction()
    producer.send(_message(TXN, body), txn)
    txn.commit()
    plain_rates, txn_rates, ratios = [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(messages):
            producer.send(_message(PLAIN, body))
        plain = _rate(messages, time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(messages):
            txn = producer.begin_transaction()
            producer.send(_message(TXN, body), txn)
            txn.commit()
        committed = _rate(messages, time.perf_counter() - t)
        plain_rates.append(plain)
        txn_rates.append(committed)
        ratios.append(committed / plain if plain else 0.0)
    producer.shutdown()
    _emit({"kind": "send_commit", "messages_per_round": messages, "rounds": rounds,
           "plain_msgs_per_s": statistics.median(plain_rates),
           "send_commit_msgs_per_s": statistics.median(txn_rates),
           "ratio": round(statistics.median(ratios), 3), "target": 0.4})


def _open_count(endpoint: str) -> int:
    import subprocess

    r = subprocess.run([sys.executable, "-m", "stratamq.cli", "transaction", "list",
                        "--endpoint", endpoint], capture_output=True, text=True, check=True)
    return sum(1 for line in r.stdout.splitlines() if line.strip())


def check_back(endpoint: str, halves: int) -> None:
    from rocketmq import Producer
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.v5.producer import TransactionChecker

    class Commit(TransactionChecker):
        def __init__(self) -> None:
            self.checks = 0
            self.first = 0.0

        def check(self, message):
            if not self.checks:
                self.first = time.perf_counter()
            self.checks += 1
            return pb.COMMIT

    class Unknown(TransactionChecker):  # while sending: checked, left open
        def check(self, message):
            return pb.TRANSACTION_RESOLUTION_UNSPECIFIED

    producer = Producer(_config(endpoint), (TXN,), Unknown())
    producer.startup()
    body = os.urandom(1024)
    for _ in range(halves):
        producer.send(_message(TXN, body), producer.begin_transaction())  # never ended
    producer.shutdown()
    deadline = time.monotonic() + 600
    while _open_count(endpoint) < halves:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_open_count(endpoint)} of {halves} halves are open")
        time.sleep(0.2)
    checker = Commit()
    producer = Producer(_config(endpoint), (TXN,), checker)
    producer.startup()
    deadline = time.monotonic() + 1800
    while _open_count(endpoint) and time.monotonic() < deadline:
        time.sleep(0.2)
    elapsed = time.perf_counter() - checker.first  # from the round's first check
    left = _open_count(endpoint)
    producer.shutdown()
    _emit({"kind": "check_back", "open_halves": halves, "seconds": round(elapsed, 2),
           "checks_per_s": _rate(halves - left, elapsed), "checker_calls": checker.checks,
           "still_open": left})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--open-halves", type=int, default=None)
    args = parser.parse_args()
    messages = args.messages or (200 if args.quick else 1000)
    rounds = args.rounds or (2 if args.quick else 5)
    halves = args.open_halves or (1000 if args.quick else 10_000)
    logging.getLogger("rocketmq").setLevel(logging.ERROR)
    os.environ.setdefault("HOME", tempfile.mkdtemp(prefix="stratamq-bench-home-"))
    _emit({"kind": "env", "python": platform.python_version(), "cpus": os.cpu_count(),
           "messages_per_round": messages, "rounds": rounds, "open_halves": halves})
    with tempfile.TemporaryDirectory(prefix="stratamq-bench-tx-") as tmp:
        broker = start_broker(Path(tmp), {"mappedFileSizeCommitLog": str(64 << 20),
                                          # RocketMQ's default interval: a round
                                          # checks every due half once, and a round
                                          # every second would ask a slow client again
                                          # before it answered
                                          "transactionCheckInterval": "30000",
                                          "transactionTimeOut": "1000",
                                          # UNKNOWN answers while the halves are sent must
                                          # not move any to TRANS_CHECK_MAX_TIME_TOPIC
                                          "transactionCheckMax": "1000000"},
                              topics=[(PLAIN, 4, "NORMAL"), (TXN, 4, "TRANSACTION")])
        try:
            send_commit(broker.endpoint, messages, rounds)
            check_back(broker.endpoint, halves)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
