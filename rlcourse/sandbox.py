"""Run model-written Python in a separate process with time, memory and file limits and no network.

Any reward that executes code a model wrote (unit tests of a generated function, a calculator tool)
goes through :func:`run_python`; nothing in the package calls ``exec`` on model output in-process.

The child process is started with ``python -I -B`` (isolated, no bytecode written: no user site-packages, no environment
variables read) in a fresh temporary directory and an empty environment, and it runs under

- a wall-clock limit (the parent kills the child's whole process group) and a CPU-time limit;
- an address-space limit (``RLIMIT_AS``), so a large allocation raises ``MemoryError`` in the child;
- a file-size limit (``RLIMIT_FSIZE``);
- an audit hook (PEP 578) installed before the code runs, which refuses sockets, starting
  processes, loading C libraries through ``ctypes``, and opening a file for writing (or removing,
  renaming, creating a directory) anywhere outside the temporary directory.

These limits stop the accidents an RL run produces (a loop that never ends, a list that eats the
memory, a stray write or a download attempt); they are not a security boundary against code written
to escape them (C extensions already loaded can bypass audit hooks). For untrusted code at scale, run
the rewards in a container or a VM with no network.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

# installed in the child before the user's code; ROOT is the sandbox directory
_PRELUDE = textwrap.dedent('''
    import os, sys
    ROOT = os.path.realpath(os.getcwd())
    BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
               "os.forkpty", "ctypes.", "pty.", "sys.remote_exec")
    WRITES = {"os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace", "os.mkdir", "os.truncate",
              "os.chmod", "os.chown", "os.link", "os.symlink", "shutil.rmtree", "shutil.copyfile", "shutil.move"}

    def inside(path):
        try:
            real = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else ROOT)
        except Exception:
            return False
        return real == ROOT or real.startswith(ROOT + os.sep)

    def hook(event, args):
        if event.startswith(BLOCKED):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and args:
            path, mode, flags = args[0], args[1], args[2] if len(args) > 2 else 0
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if writing and not isinstance(path, int) and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the sandbox directory is not allowed")
        elif event in WRITES and args and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            raise PermissionError(f"sandbox: {event} outside the sandbox directory is not allowed")

    sys.addaudithook(hook)
    del hook
    with open("main.py") as _f:
        _code = compile(_f.read(), "main.py", "exec")
    del _f
    exec(_code, {"__name__": "__main__"})
''')


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. ``ok``: exit status 0 within the time limit. ``reason`` says in a
    few words why not (``"timed out after 2.0 s"``, ``"MemoryError"``, ``"PermissionError: sandbox:
    socket.__new__ is not allowed"``, ``"exit status 3"``)."""

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    reason: str


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def run_python(code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, max_file_mb: int = 16,
               stdin: str = "", output_limit: int = 100_000) -> SandboxResult:
    """Run ``code`` (a Python program) in a sandboxed child process and return what it printed.

    ``timeout_s`` bounds wall-clock time (and, rounded up, CPU time); ``memory_mb`` the address
    space; ``max_file_mb`` any file it writes (inside its own temporary directory, deleted
    afterwards); ``output_limit`` the characters of stdout/stderr kept."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if timeout_s <= 0 or memory_mb < 64 or max_file_mb < 0:
        raise ValueError(f"need timeout_s > 0, memory_mb >= 64 (the interpreter itself needs ~30 MB) and "
                         f"max_file_mb >= 0; got {timeout_s}, {memory_mb}, {max_file_mb}")
    if sys.platform != "linux":
        raise RuntimeError("rlcourse.sandbox needs Linux (resource limits and process groups)")
    import resource

    def limits():  # runs in the child between fork and exec
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        cpu = int(timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_mb << 20, max_file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    with tempfile.TemporaryDirectory(prefix="rlcourse-sandbox-") as folder:
        Path(folder, "main.py").write_text(code)
        proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", _PRELUDE], cwd=folder, env={"PYTHONHASHSEED": "0"},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=limits)
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
    out, err = out[:output_limit], err[:output_limit]
    code_ = proc.returncode
    if timed_out or code_ == -signal.SIGXCPU:
        reason, timed_out = f"timed out after {timeout_s} s", True
    elif code_ == 0:
        reason = "ok"
    elif code_ is not None and code_ < 0:
        reason = f"killed by signal {signal.Signals(-code_).name}"
    else:
        reason = _last_error(err) or f"exit status {code_}"
    return SandboxResult(ok=code_ == 0 and not timed_out, returncode=code_, stdout=out, stderr=err,
                         timed_out=timed_out, reason=reason)
