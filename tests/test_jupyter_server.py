"""A chapter as a JupyterLab reader meets it: a real Jupyter server opens the chapter's ``.md`` as a
notebook (jupytext's contents manager, which the README's setup installs), and a kernel started by
that server runs its first code cells over the server's websocket, as JupyterLab's front end does."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "book/lab.md"
FIRST_CELLS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter_server(tmp_path_factory):
    exe = Path(sys.executable).with_name("jupyter-server")
    if not exe.exists():
        pytest.skip("jupyter-server is not installed in this environment (the README's setup installs it)")
    port, token = free_port(), uuid.uuid4().hex
    runtime = tmp_path_factory.mktemp("jupyter-runtime")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(runtime / "config")}
    log = open(runtime / "server.log", "w+")  # a file, not a pipe nobody reads (a full pipe blocks the server)
    proc = subprocess.Popen([str(exe), "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
                             "--allow-root"],  # CI runs as root
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                get(base, "/api/status", token)
                break
            except OSError:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"the Jupyter server exited:\n{log.read()[-3000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("the Jupyter server did not answer within 60 s")
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def get(base: str, path: str, token: str, method: str = "GET", body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def test_the_server_opens_a_chapter_as_a_notebook(jupyter_server):
    base, token = jupyter_server
    model = get(base, f"/api/contents/{CHAPTER}?type=notebook&content=1", token)
    assert model["type"] == "notebook", model["type"]
    cells = model["content"]["cells"]
    assert any(c["cell_type"] == "code" for c in cells) and any(c["cell_type"] == "markdown" for c in cells)
    assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"


def test_saving_a_chapter_from_the_server_writes_the_same_markdown(jupyter_server):
    """What JupyterLab does on save: the notebook model goes back through the contents API and
    jupytext writes MyST Markdown; with the repository's jupytext.toml the file is byte-identical
    (no version stamps added to the header, no outputs)."""
    base, token = jupyter_server
    model = get(base, f"/api/contents/{CHAPTER}?type=notebook&content=1", token)
    copy = f"book/_saved_by_test_{uuid.uuid4().hex[:8]}.md"
    try:
        get(base, f"/api/contents/{copy}", token, method="PUT",
            body={"type": "notebook", "format": "json", "content": model["content"]})
        assert (ROOT / copy).read_text() == (ROOT / CHAPTER).read_text()
    finally:
        (ROOT / copy).unlink(missing_ok=True)


def execute_over_websocket(base: str, token: str, kernel_id: str, codes: list[str], timeout: float = 300) -> list[dict]:
    """Run each code string in the kernel through the server's channels websocket; return one record
    per cell: its reply status and the error (ename, evalue) if it raised."""
    from tornado import ioloop, websocket

    async def run() -> list[dict]:
        url = base.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels?token={token}"
        ws = await websocket.websocket_connect(url)
        session, records = uuid.uuid4().hex, []
        for code in codes:
            msg_id = uuid.uuid4().hex
            await ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                           "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            record, idle = {}, False
            deadline = time.monotonic() + timeout
            while not (idle and "status" in record):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no reply within {timeout} s to {code[:80]!r}")
                raw = await ws.read_message()
                if raw is None:
                    raise ConnectionError("the kernel's websocket closed")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "execute_reply":
                    record["status"] = msg["content"]["status"]
                elif kind == "error":
                    record["error"] = (msg["content"]["ename"], msg["content"]["evalue"])
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            records.append(record)
        ws.close()
        return records

    return ioloop.IOLoop.current().run_sync(run, timeout=timeout * len(codes) + 30)


def test_a_kernel_started_by_the_server_runs_the_first_cells(jupyter_server):
    base, token = jupyter_server
    cells = get(base, f"/api/contents/{CHAPTER}?type=notebook&content=1", token)["content"]["cells"]
    codes = [c["source"] for c in cells if c["cell_type"] == "code"][:FIRST_CELLS]
    kernel = get(base, "/api/kernels", token, method="POST", body={"name": "python3", "path": str(Path(CHAPTER).parent)})
    try:
        records = execute_over_websocket(base, token, kernel["id"], codes)
    finally:
        get(base, f"/api/kernels/{kernel['id']}", token, method="DELETE")
    for code, record in zip(codes, records):
        assert record.get("status") == "ok", f"{CHAPTER}: cell {code[:80]!r} failed in the server's kernel: {record}"
    assert len(records) == len(codes) == FIRST_CELLS
