"""Bad input and broken output on the command line: one ``Error:`` line naming what was wrong,
a non-zero exit code, never a traceback. Every case runs the CLI as a real process."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as stratamq/cli/app.py documents


@pytest.fixture
def run(python_exe):
    def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("stdout", subprocess.PIPE)
        return subprocess.run([python_exe, "-m", "stratamq.cli", *args], cwd=PROJECT,
                              stderr=subprocess.PIPE, text=True, timeout=120, **kwargs)

    return run


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory) -> Path:
    """A small real store (1,000 messages: its dump is more than a pipe buffer holds)."""
    root = tmp_path_factory.mktemp("cli-errors") / "store"
    # sys.executable: the python_exe fixture is function-scoped.
    subprocess.run([sys.executable, "-m", "stratamq.cli", "demo", "--store", str(root),
                    "--messages", "1000"], cwd=PROJECT, check=True, capture_output=True,
                   timeout=120)
    return root


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "afile"
    path.write_text("not a store\n")
    return path


def error_line(proc: subprocess.CompletedProcess, code: int = 1) -> str:
    """The one ``Error:`` line of a failed run, after checking the exit code and that nothing
    else went wrong on the way (a traceback, a second error)."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


# -- store directories ----------------------------------------------------------------------------


def test_demo_refuses_a_file_as_store_directory(run, a_file):
    line = error_line(run("demo", "--messages", "1", "--store", str(a_file)))
    assert line == f"Error: store directory {a_file} is a file"


def test_demo_says_why_the_store_directory_cannot_be_created(run, a_file):
    line = error_line(run("demo", "--messages", "1", "--store", str(a_file / "sub")))
    assert line == f"Error: cannot create store directory {a_file / 'sub'}: Not a directory"


def test_demo_says_why_the_store_cannot_be_opened(run, tmp_path):
    # What a read-only mount does, reproducible without one: the store cannot make a part.
    root = tmp_path / "store"
    root.mkdir()
    (root / "commitlog").write_text("a file where the CommitLog directory goes")
    line = error_line(run("demo", "--messages", "1", "--store", str(root)))
    assert line.startswith(f"Error: cannot open store {root}: ")
    assert "commitlog" in line


def test_bench_store_refuses_a_file_and_a_directory_it_cannot_create(run, a_file):
    args = ("bench", "store", "--messages", "2", "--body-size", "10", "--store")
    line = error_line(run(*args, str(a_file)))
    assert line == f"Error: store directory {a_file} is a file"
    line = error_line(run(*args, str(a_file / "sub")))
    assert line == f"Error: cannot create store directory {a_file / 'sub'}: Not a directory"


def test_bench_store_leaves_an_existing_store_and_a_non_empty_directory_alone(run, demo_store,
                                                                                tmp_path):
    args = ("bench", "store", "--messages", "2", "--body-size", "10", "--store")
    before = sorted(p.name for p in demo_store.iterdir())
    line = error_line(run(*args, str(demo_store)))
    assert line == (f"Error: store directory {demo_store} already holds a store: "
                    "the bench needs an empty one")
    assert sorted(p.name for p in demo_store.iterdir()) == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    line = error_line(run(*args, str(other)))
    assert line == f"Error: store directory {other} is not empty: the bench needs an empty one"
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_bench_store_runs_in_an_empty_directory(run, tmp_path):
    root = tmp_path / "bench"
    proc = run("bench", "store", "--messages", "2", "--body-size", "10", "--store", str(root))
    assert proc.returncode == 0, proc.stderr
    assert '"messages_read":2' in proc.stdout


def test_bench_store_refuses_a_body_over_max_message_size(run):
    line = error_line(run("bench", "store", "--messages", "2", "--body-size", "5000000"), code=2)
    assert "'--body-size'" in line and "5000000" in line and "maxMessageSize (4194304)" in line


def test_bench_cq_refuses_a_file_a_directory_it_cannot_create_and_a_big_body(run, a_file):
    args = ("bench", "cq", "--queues", "1", "--messages-per-queue", "1")
    line = error_line(run(*args, "--store-type", "default", "--store", str(a_file)))
    assert line == f"Error: store directory {a_file} is a file"
    line = error_line(run(*args, "--store-type", "default", "--store", str(a_file / "sub")))
    assert line == f"Error: cannot create store directory {a_file / 'sub'}: Not a directory"
    proc = run(*args, "--store-type", "defaultRocksDB", "--body-size", "5000000")
    assert error_line(proc) == "Error: body size 5000000 is more than maxMessageSize (4194304)"
    assert proc.stdout == ""


def small_file_limit() -> None:
    """In the child: files may not grow past 1 MiB, so the first CommitLog segment cannot be
    made (Python ignores SIGXFSZ: the write fails with EFBIG instead of killing the process)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))


def test_a_bench_store_run_that_fails_says_why(run):
    proc = run("bench", "store", "--messages", "2", "--body-size", "10",
               preexec_fn=small_file_limit)
    line = error_line(proc)
    assert line.startswith("Error: bench failed: ") and "File too large" in line
    assert proc.stdout == ""


def test_a_bench_cq_run_that_fails_keeps_its_json_line_and_exits_1(run):
    proc = run("bench", "cq", "--queues", "1", "--messages-per-queue", "1", "--store-type",
               "default", preexec_fn=small_file_limit)
    assert '"error":' in proc.stdout and "File too large" in proc.stdout
    line = error_line(proc)
    assert line.startswith("Error: bench failed: ") and "File too large" in line


# -- output that cannot be written ----------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", [["store", "stat"], ["store", "dump"]])
def test_a_full_disk_under_stdout_is_one_error_line(run, demo_store, command):
    with open("/dev/full", "w") as full:
        proc = run(*command, "--store", str(demo_store), stdout=full)
    assert error_line(proc) == "Error: cannot write output: No space left on device"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_help_to_a_full_disk_is_one_error_line(run):
    with open("/dev/full", "w") as full:
        proc = run("--help", stdout=full)
    assert error_line(proc) == "Error: cannot write output: No space left on device"


def test_a_pipe_closed_before_the_first_line_ends_the_dump_quietly(python_exe, demo_store):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write gets EPIPE
    try:
        proc = subprocess.run([python_exe, "-m", "stratamq.cli", "store", "dump", "--store",
                               str(demo_store)], cwd=PROJECT, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == EXIT_BROKEN_PIPE
    assert proc.stderr == ""


def test_a_reader_that_stops_after_one_line_ends_the_dump_quietly(python_exe, demo_store):
    # `stratamq store dump | head -1`: the dump (~400 KB) outgrows the pipe buffer, so it is
    # still writing when the reader goes.
    proc = subprocess.Popen([python_exe, "-m", "stratamq.cli", "store", "dump", "--store",
                             str(demo_store)], cwd=PROJECT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert first.startswith(b'{"topic":')
    assert stderr == ""


# -- broker start ---------------------------------------------------------------------------------


@pytest.mark.parametrize("listen, says", [
    ("127.0.0.1:70000", "port 70000 is out of range 0..65535"),
    ("127.0.0.1:65536", "port 65536 is out of range 0..65535"),
    ("127.0.0.1", "must be HOST:PORT"),
    ("127.0.0.1:-1", "must be HOST:PORT"),
])
def test_broker_refuses_a_listen_port_out_of_range(run, tmp_path, listen, says):
    proc = run("broker", "start", "--store", str(tmp_path / "store"), "--listen", listen)
    line = error_line(proc, code=2)
    assert "'--listen'" in line and says in line
    assert not (tmp_path / "store").exists()  # refused before anything was created


def test_broker_refuses_a_file_as_store_directory(run, a_file):
    line = error_line(run("broker", "start", "--store", str(a_file), "--listen", "127.0.0.1:0"))
    assert line == f"Error: store directory {a_file} is a file"


def test_broker_says_the_port_is_in_use(run, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run("broker", "start", "--store", str(tmp_path / "store"),
                   "--listen", f"127.0.0.1:{port}")
    line = error_line(proc)
    assert line == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"


# -- admin commands -------------------------------------------------------------------------------


@pytest.mark.parametrize("command, endpoint", [
    (["topic", "list"], ""),
    (["topic", "list"], "127.0.0.1"),
    (["topic", "list"], "127.0.0.1:70000"),
    (["topic", "list"], "127.0.0.1:0"),
    (["topic", "list"], ":8081"),
    (["topic", "list"], "::1:8081"),
    (["group", "progress", "--group", "g"], ""),
    (["topic", "create", "--topic", "T"], "localhost"),
])
def test_admin_commands_refuse_an_endpoint_that_is_not_host_port(run, command, endpoint):
    proc = run(*command, "--endpoint", endpoint)
    line = error_line(proc, code=2)
    assert line == ("Error: Invalid value for '--endpoint': must be HOST:PORT with a port "
                    f"1..65535, not {endpoint!r}")
    # Refused before gRPC saw it: no C-core resolver lines, no "no broker reachable".
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()][-1] == line
    assert "resolver" not in proc.stderr and "reachable" not in proc.stderr
