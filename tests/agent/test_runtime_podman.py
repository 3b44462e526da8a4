"""The podman runtime with real containers: the busybox image scripts/build-images.sh makes
from the Debian package busybox-static, serving HTTP on a published port.

podman, runc and busybox-static come from scripts/setup.sh; without them these tests fail
(they do not skip), so a machine that cannot run containers is noticed."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from oci_images import ensure_images

from gpufleet.agent.runtime.base import ContainerSpec, GPUAssignment, PortMapping, RuntimeError_
from gpufleet.agent.runtime.crilog import read_cri_messages
from gpufleet.agent.runtime.podman import (
    PodmanRuntime,
    build_run_args,
    container_name,
    parse_go_duration,
    parse_size,
    parse_time,
)

# Built by scripts/build-images.sh (images/busybox): every applet, and /www/index.html.
IMAGE = "localhost/gpufleet/busybox:1"
BUSYBOX = "/bin/busybox"
INDEX_HTML = "hello from gpufleet\n"


def spec_for(tmp_path: Path, command: list[str], args: list[str] | None = None, **kw) -> ContainerSpec:
    pod = kw.pop("pod_name", f"t{uuid.uuid4().hex[:10]}")
    return ContainerSpec(
        pod_uid=kw.pop("pod_uid", str(uuid.uuid4())),
        pod_name=pod,
        namespace=kw.pop("namespace", "default"),
        name=kw.pop("name", "main"),
        image=kw.pop("image", IMAGE),
        command=command,
        args=args or [],
        env=kw.pop("env", {}),
        working_dir=kw.pop("working_dir", None),
        log_path=kw.pop("log_path", str(tmp_path / "logs" / pod / "main" / "0.log")),
        **kw,
    )


# --- pure pieces (no podman needed) -------------------------------------------------------


def test_run_args_follow_kubernetes_semantics(tmp_path):
    spec = spec_for(
        tmp_path,
        ["python", "-m", "server"],
        ["--port", "8080"],
        pod_name="web",
        namespace="team-a",
        env={"A": "1", "MULTI": "line1\nline2"},
        working_dir="/app",
        ports=[PortMapping("http", 8080, 31080)],
        cpu_limit_millis=1500,
        memory_limit_bytes=2 << 30,
        gpus=[GPUAssignment(2, "GPU-x"), GPUAssignment(5, "GPU-y")],
        attempt=3,
    )
    name = container_name(spec)
    assert name == "gpufleet-team-a-web-main-3"
    args = build_run_args(spec, name=name, log_path="/l/3.log", env_file="/e/env")
    joined = " ".join(args)
    assert args[:4] == ["run", "-d", "--name", name]
    for flag in (
        "--runtime runc",
        "--init",
        "--ulimit nofile=1024:1024",
        "--ulimit nproc=1024:1024",
        "--env-file /e/env",
        "-w /app",
        "-p 31080:8080/tcp",
        "--cpus 1.5",
        f"--memory {2 << 30}b",
        "--device nvidia.com/gpu=GPU-x",
        "--device nvidia.com/gpu=GPU-y",
        "--log-driver k8s-file --log-opt path=/l/3.log",
        '--entrypoint ["python", "-m", "server"]',
        "--label gpufleet.io/pod=web",
    ):
        assert flag in joined, flag
    # The image, then args as its CMD.
    assert args[-3:] == [IMAGE, "--port", "8080"]
    # A value a line-based env file cannot hold goes on the command line; the rest do not.
    assert "-e" in args and "MULTI=line1\nline2" in args
    assert "A=1" not in args


def test_run_args_without_command_keep_the_entrypoint(tmp_path):
    spec = spec_for(tmp_path, [], ["serve"])
    args = build_run_args(spec, name="n", log_path="/l", env_file=None)
    assert "--entrypoint" not in args
    assert args[-2:] == [IMAGE, "serve"]
    # Without an env file everything goes through -e.
    assert "CUDA_VISIBLE_DEVICES=" in args and "NVIDIA_VISIBLE_DEVICES=void" in args


def test_gpus_are_renumbered_inside_the_container(tmp_path):
    from gpufleet.agent.runtime.podman import container_env

    env = container_env(
        spec_for(tmp_path, ["x"], gpus=[GPUAssignment(4, "GPU-a"), GPUAssignment(6, "GPU-b")])
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"


def test_parsers():
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert parse_time("2024-05-01T12:00:00.123456789Z") == pytest.approx(1714564800.123456)
    assert parse_time("2024-05-01 12:00:00.5 +0000 UTC") == pytest.approx(1714564800.5)
    assert parse_go_duration("39.222807ms") == pytest.approx(0.039222807)
    assert parse_go_duration("1m2.5s") == pytest.approx(62.5)
    assert parse_size("462.8kB") == 462800
    assert parse_size("1.5GiB") == int(1.5 * 1024**3)
    assert parse_size("0B") == 0


# --- real containers ----------------------------------------------------------------------


def _require_tools() -> None:
    missing = [t for t in ("podman", "runc") if shutil.which(t) is None]
    if not os.path.exists(BUSYBOX):
        missing.append("busybox-static (/bin/busybox)")
    if missing:
        pytest.fail(
            f"the podman runtime tests need {', '.join(missing)}: run scripts/setup.sh "
            "(apt-get install -y podman runc busybox-static)",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def busybox_image() -> str:
    _require_tools()
    return ensure_images("busybox")["busybox"]


@pytest.fixture
async def rt(tmp_path, busybox_image):
    runtime = PodmanRuntime(tmp_path / "state")
    handles = []
    orig_start = runtime.start

    async def start(spec):
        h = await orig_start(spec)
        handles.append(h)
        return h

    runtime.start = start  # type: ignore[method-assign]
    yield runtime
    for h in handles:
        await runtime.remove(h)
    await runtime.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_get(url: str, deadline_s: float) -> str:
    deadline = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered: {last}")


async def test_httpd_on_a_published_port_then_a_clean_stop(rt, tmp_path):
    port = _free_port()
    spec = spec_for(
        tmp_path,
        ["busybox", "httpd", "-f", "-p", "8080", "-h", "/www"],
        ports=[PortMapping("http", 8080, port)],
        cpu_limit_millis=500,
        memory_limit_bytes=64 << 20,
    )
    h = await rt.start(spec)
    assert (await rt.state(h)).state == "running"
    body = await asyncio.to_thread(_http_get, f"http://127.0.0.1:{port}/index.html", 20)
    assert body == INDEX_HTML

    t0 = time.monotonic()
    st = await rt.stop(h, grace_seconds=10)
    elapsed = time.monotonic() - t0
    # SIGTERM reached httpd: it ended long before the grace period and was not SIGKILLed.
    assert elapsed < 8, elapsed
    assert st.state == "exited"
    assert st.exit_code == 143, st
    assert st.finished_at is not None and st.started_at is not None
    await rt.remove(h)
    assert (await rt.state(h)).state == "unknown"
    names = await asyncio.to_thread(
        subprocess.run,
        ["podman", "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert container_name(spec) not in names.stdout.split()


async def test_exit_code_env_working_dir_and_logs(rt, tmp_path):
    spec = spec_for(
        tmp_path,
        ["sh", "-c", 'echo "$FOO"; pwd; echo "[$CUDA_VISIBLE_DEVICES]"; echo oops >&2; exit 3'],
        env={"FOO": "bar baz=qux"},
        working_dir="/tmp",
    )
    h = await rt.start(spec)
    st = await asyncio.wait_for(rt.wait(h), 60)
    assert (st.state, st.exit_code, st.reason) == ("exited", 3, "Error")
    pairs = read_cri_messages(spec.log_path, with_streams=True)
    assert ("stdout", "bar baz=qux") in pairs
    assert ("stdout", "/tmp") in pairs
    assert ("stdout", "[]") in pairs
    assert ("stderr", "oops") in pairs
    # The environment file is gone once podman read it.
    assert not list((tmp_path / "state" / "env").glob("*.env"))


async def test_exec_and_stats(rt, tmp_path):
    spec = spec_for(tmp_path, ["sleep", "300"], env={"FOO": "bar"}, working_dir="/www")
    h = await rt.start(spec)
    code, out = await rt.exec(h, ["sh", "-c", "echo $FOO; pwd; exit 2"], timeout=30)
    assert (code, out.split()) == (2, ["bar", "/www"])
    code, out = await rt.exec(h, ["sleep", "30"], timeout=1)
    assert code == -1 and "timed out" in out
    stats = await rt.stats(h)
    assert stats is not None and stats.memory_bytes > 0 and stats.cpu_millis >= 0
    st = await rt.stop(h, grace_seconds=0)
    assert st.exit_code in (137, 143)
    assert st.reason == "Error"


async def test_a_missing_executable_cannot_run(rt, tmp_path):
    spec = spec_for(tmp_path, ["/no/such/program"])
    try:
        h = await rt.start(spec)
    except RuntimeError_ as e:
        assert "failed to exec" in str(e) or "not found" in str(e)
        assert e.reason == "RunContainerError"
        return
    st = await asyncio.wait_for(rt.wait(h), 60)
    assert st.reason == "ContainerCannotRun", st


async def test_memory_limit_is_oomkilled(rt, tmp_path, monkeypatch):
    # The agent's own working directory: conmon's "oom" marker must not land there.
    cwd = tmp_path / "agent-cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    # busybox tail keeps a line with no end in memory: /dev/zero has no newline.
    spec = spec_for(tmp_path, ["tail", "/dev/zero"], memory_limit_bytes=32 << 20)
    h = await rt.start(spec)
    st = await asyncio.wait_for(rt.wait(h), 60)
    assert (st.exit_code, st.reason) == (137, "OOMKilled"), st
    assert list(cwd.iterdir()) == []


async def test_bad_image_cannot_start(rt, tmp_path):
    spec = spec_for(tmp_path, ["true"], image="localhost/gpufleet-no-such-image:never")
    with pytest.raises(RuntimeError_) as e:
        await rt.start(spec)
    assert e.value.reason == "ErrImagePull", e.value


async def test_a_pod_of_the_same_name_under_another_agent_is_left_running(rt, tmp_path):
    """Two agents on one machine (two nodes, or two clusters) may run pods of the same
    namespace, name and container: neither start may take the other's container away."""
    spec = spec_for(tmp_path, ["sleep", "300"], pod_name=f"twin-{uuid.uuid4().hex[:8]}")
    mine = await rt.start(spec)
    other = PodmanRuntime(tmp_path / "other-agent")
    theirs = await other.start(spec_for(tmp_path, ["sleep", "300"], pod_name=spec.pod_name,
                                        log_path=str(tmp_path / "other.log")))
    try:
        assert theirs.id != mine.id
        assert (await rt.state(mine)).state == "running"
        assert (await other.state(theirs)).state == "running"
        # Its own container of that name it replaces, as one it lost track of.
        again = await rt.start(spec)
        assert (await rt.state(again)).state == "running"
        assert (await other.state(theirs)).state == "running"
    finally:
        await other.remove(theirs)
        await other.close()
