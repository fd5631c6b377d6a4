"""rlcourse.sandbox: model-written code runs with time, memory and file limits and no network.

Every call but the infinite loop's gets a generous time limit (``SLOW``): starting an interpreter
takes seconds on a loaded 2-core CI machine."""
import os
import time

import pytest

from rlcourse.sandbox import run_python as _run

SLOW = 60.0


def run_python(code, **kw):
    return _run(code, **{"timeout_s": SLOW, **kw})


def test_ordinary_code_runs_and_prints():
    r = run_python("import math\nprint(sum(i * i for i in range(10)), math.factorial(5))\n"
                   "open('scratch.txt', 'w').write('inside is fine')\nprint(open('scratch.txt').read())")
    assert r.ok and r.reason == "ok", r
    assert r.stdout.split("\n")[:2] == ["285 120", "inside is fine"]


def test_stdin_and_failures_are_reported():
    assert run_python("print(input()[::-1])", stdin="abc\n").stdout.strip() == "cba"
    r = run_python("raise SystemExit(3)")
    assert not r.ok and r.returncode == 3 and r.reason == "exit status 3"
    r = run_python("1 / 0")
    assert not r.ok and r.reason.startswith("ZeroDivisionError")


def test_an_infinite_loop_is_killed_at_the_time_limit():
    t0 = time.perf_counter()
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and not r.ok and "timed out" in r.reason
    assert time.perf_counter() - t0 < 30  # killed, not waited for (generous: a loaded CI machine)


def test_a_large_allocation_fails_inside_the_child():
    r = run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert not r.ok and "allocated" not in r.stdout and "MemoryError" in r.reason, r


def test_writing_outside_its_directory_is_refused(tmp_path):
    target = tmp_path / "outside.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
                 f"import os\nos.mkdir({str(tmp_path / 'newdir')!r})",
                 "open('../escape.txt', 'w')"):
        r = run_python(code)
        assert not r.ok and "PermissionError" in r.reason and "outside the sandbox" in r.reason, (code, r)
    assert not target.exists() and not (tmp_path / "newdir").exists()
    # reading is allowed (the standard library has to be read)
    (tmp_path / "readable.txt").write_text("hello")
    assert run_python(f"print(open({str(tmp_path / 'readable.txt')!r}).read())").stdout.strip() == "hello"


def test_network_and_processes_are_refused():
    for code, event in (("import socket\nsocket.socket()", "socket"),
                        ("import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=1)", "socket"),
                        ("import subprocess\nsubprocess.run(['ls'])", "subprocess"),
                        ("import os\nos.system('ls')", "os.system")):
        r = run_python(code)
        assert not r.ok and "PermissionError" in r.reason and event in r.reason, (code, r)


def test_the_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("RLCOURSE_SECRET", "do-not-leak")
    r = run_python("import os\nprint(os.environ.get('RLCOURSE_SECRET'))")
    assert r.stdout.strip() == "None"
    assert os.environ["RLCOURSE_SECRET"] == "do-not-leak"


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("pass", memory_mb=8)
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(b"pass")
