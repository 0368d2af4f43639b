"""Every snippet in README.md runs, as written: the README cannot drift from the code.

Blocks are run in order in one scratch directory (so ``./data`` is the snippet's own), against
a broker started for the test; the only change made to a block is the broker's address
(``127.0.0.1:10911`` becomes the test broker's port) and ``.venv/bin/stratamq`` the running
interpreter's. A block that cannot run here says why in an HTML comment right above it
(``<!-- not run: why -->``); ``properties`` blocks are read as a ``broker.conf``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT
from test_broker_harness import BrokerProcess

from stratamq.config_file import read_broker_conf

README = PROJECT / "README.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]+?) -->\n)?```(?P<lang>\w+)\n(?P<code>.*?)```",
                   re.S)
RUNNABLE = {"sh", "python", "properties"}


def blocks() -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["why"]) for m in BLOCK.finditer(README.read_text())]


def test_every_block_runs_or_says_why_not():
    found = blocks()
    assert found
    for lang, code, why in found:
        assert lang in RUNNABLE | {"text"}, (lang, code[:80])
        if lang == "text":
            assert why, f"a text block must say why it is not run: {code[:80]!r}"


@pytest.fixture
def scratch(tmp_path):
    broker = BrokerProcess(tmp_path / "broker-store").start()
    work = tmp_path / "work"
    work.mkdir()
    yield broker, work
    broker.terminate()


def test_readme_snippets_run_as_written(scratch):
    broker, work = scratch
    cli = str(Path(sys.executable).parent / "stratamq")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=false pyspark-shell"}
    outputs = []
    for lang, code, why in blocks():
        if why is not None:
            continue
        if lang == "properties":
            conf = read_broker_conf(text=code)
            assert (conf.unknown, conf.warnings, conf.ignored) == ([], [], []), conf
            continue
        code = code.replace("127.0.0.1:10911", broker.endpoint)
        code = code.replace(".venv/bin/stratamq", cli)
        argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [
            sys.executable, "-c", code]
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{lang} block failed:\n{code}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    text = "\n".join(outputs)
    assert "b'hello'" in text  # the official client received what it sent
    assert '"body":"hello again"' in text  # the console consumer got the console producer's
    assert "PUT_OK" in text  # the embedded store
    assert any("Orders" in line and "hello" in line for line in outputs[-1].splitlines()), \
        outputs[-1]  # Spark read the embedded store's message
