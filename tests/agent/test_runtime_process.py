"""The process runtime against real host processes in real bubblewrap sandboxes (and the
real cgroups where this machine lets us write them).

A container sees the node's files read-only and its own /tmp, so what a test wants to read
back from inside one goes through a volume (``out_mount``). The sandbox itself (users,
hidden paths, /dev/shm, recovery) is tested in test_runtime_process_sandbox.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpufleet.agent.runtime.base import ContainerSpec, GPUAssignment, Mount, RuntimeError_
from gpufleet.agent.runtime.cgroups import Cgroups
from gpufleet.agent.runtime.crilog import read_cri_messages
from gpufleet.agent.runtime.process import ProcessRuntime

PY = sys.executable


def make_spec(tmp_path: Path, command: list[str], args: list[str] | None = None, **kw) -> ContainerSpec:
    name = kw.pop("name", "main")
    uid = kw.pop("pod_uid", f"uid-{os.urandom(4).hex()}")
    return ContainerSpec(
        pod_uid=uid,
        pod_name="p",
        namespace="default",
        name=name,
        image="informational",
        command=command,
        args=args or [],
        env=kw.pop("env", {}),
        working_dir=kw.pop("working_dir", None),
        log_path=kw.pop("log_path", str(tmp_path / "logs" / uid / name / "0.log")),
        **kw,
    )


def out_mount(tmp_path: Path, name: str = "out") -> tuple[Path, Mount]:
    """A directory on the node that containers (any user) can write, seen at /<name>."""
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    d.chmod(0o777)
    return d, Mount(str(d), f"/{name}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # also when it went between two looks
        return True


def processes_with(argv: list[str]) -> list[int]:
    """Host pids running exactly argv."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.info["cmdline"] == argv and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
    return out


def raw_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


@pytest.fixture
async def rt(tmp_path):
    runtime = ProcessRuntime(tmp_path / "state")
    yield runtime
    # close() leaves containers running (they outlive the agent): stop them first.
    await runtime.stop_all(1)
    await runtime.close()


async def wait_for_line(path: str, text: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if any(text in m for m in read_cri_messages(path)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}: {read_cri_messages(path)}")


async def test_env_gpus_and_inherited_path(rt, tmp_path):
    d, mount = out_mount(tmp_path)
    out = d / "env.json"
    spec = make_spec(
        tmp_path,
        [PY, "-c", "import json, os; json.dump(dict(os.environ), open('/out/env.json', 'w'))"],
        env={"FOO": "bar", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
        gpus=[GPUAssignment(0, "GPU-aaa"), GPUAssignment(3, "GPU-bbb")],
        mounts=[mount],
    )
    h = await rt.start(spec)
    st = await rt.wait(h)
    assert (st.state, st.exit_code, st.reason) == ("exited", 0, "Completed")
    env = json.loads(out.read_text())
    assert env["FOO"] == "bar"
    # The assignment wins over whatever the pod's env says. (This machine has no
    # /dev/nvidia*, so the indices stay the node's; see the sandbox tests for renumbering.)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa,GPU-bbb"
    assert env["GPUFLEET_CDI_DEVICES"] == "nvidia.com/gpu=GPU-aaa,nvidia.com/gpu=GPU-bbb"
    assert env["PATH"] == os.environ["PATH"]
    # HOME is the container user's (the default user, nobody), not the agent's.
    assert env["HOME"] == "/nonexistent"
    assert env["HOSTNAME"] == "p"
    # Nothing else leaks from the agent's environment.
    assert "PYTEST_CURRENT_TEST" not in env


async def test_a_container_without_gpus_sees_none(rt, tmp_path):
    d, mount = out_mount(tmp_path)
    out = d / "env.json"
    spec = make_spec(
        tmp_path,
        [PY, "-c", "import json, os; json.dump(dict(os.environ), open('/out/env.json', 'w'))"],
        mounts=[mount],
    )
    await rt.wait(await rt.start(spec))
    env = json.loads(out.read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


async def test_exit_codes_and_state_after_exit(rt, tmp_path):
    h_ok = await rt.start(make_spec(tmp_path, ["sh", "-c", "exit 0"], name="ok"))
    h_bad = await rt.start(make_spec(tmp_path, [], ["sh", "-c", "exit 3"], name="bad"))
    ok, bad = await asyncio.gather(rt.wait(h_ok), rt.wait(h_bad))
    assert (ok.exit_code, ok.reason) == (0, "Completed")
    assert (bad.exit_code, bad.reason) == (3, "Error")
    assert bad.started_at is not None and bad.finished_at is not None and bad.finished_at >= bad.started_at
    # Long after the pid is gone, state still answers with what the waiter captured.
    st = await rt.state(h_bad)
    assert (st.state, st.exit_code) == ("exited", 3)


async def test_state_right_after_the_process_died(rt, tmp_path):
    h = await rt.start(make_spec(tmp_path, ["sh", "-c", "exit 7"]))
    # No pid: the process was already gone when the runtime looked.
    for _ in range(500):
        try:
            if h.pid is None or not psutil.pid_exists(h.pid) or psutil.Process(h.pid).status() == psutil.STATUS_ZOMBIE:
                break
        except (psutil.NoSuchProcess, FileNotFoundError):  # gone between the two looks
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    st = await rt.state(h)
    assert (st.state, st.exit_code) == ("exited", 7)


async def test_many_waiters_one_exit(rt, tmp_path):
    h = await rt.start(make_spec(tmp_path, ["sh", "-c", "sleep 0.2; exit 5"]))
    states = await asyncio.gather(*(rt.wait(h) for _ in range(5)))
    assert {s.exit_code for s in states} == {5}


async def test_command_is_required(rt, tmp_path):
    with pytest.raises(RuntimeError_, match="the process runtime needs a command"):
        await rt.start(make_spec(tmp_path, [], []))


async def test_missing_executable_cannot_start(rt, tmp_path):
    with pytest.raises(RuntimeError_, match="not found") as e:
        await rt.start(make_spec(tmp_path, ["no-such-program-gpufleet"]))
    assert e.value.reason == "RunContainerError"


async def test_working_dir_is_created_and_used(rt, tmp_path):
    d, mount = out_mount(tmp_path)
    # Inside a volume: created on the node, in the volume, and writable by the container.
    spec = make_spec(tmp_path, ["sh", "-c", "pwd; touch here"], working_dir="/out/work/dir", mounts=[mount])
    st = await rt.wait(await rt.start(spec))
    assert st.exit_code == 0, read_cri_messages(spec.log_path)
    assert (d / "work" / "dir" / "here").is_file()
    assert read_cri_messages(spec.log_path) == ["/out/work/dir"]
    # Under /tmp (the container's own), and at a new top-level path.
    for wd in ("/tmp/a/b", "/brand-new"):
        spec = make_spec(tmp_path, ["sh", "-c", "pwd"], working_dir=wd, name="x" + str(len(wd)))
        st = await rt.wait(await rt.start(spec))
        assert st.exit_code == 0
        assert read_cri_messages(spec.log_path) == [wd]
    # The default is the container's private /tmp.
    spec = make_spec(tmp_path, ["sh", "-c", "pwd; touch scratch && echo writable"], name="dflt")
    await rt.wait(await rt.start(spec))
    assert read_cri_messages(spec.log_path) == ["/tmp", "writable"]
    # Elsewhere the node's filesystem is read-only: refused, saying so.
    with pytest.raises(RuntimeError_, match="read-only") as e:
        await rt.start(make_spec(tmp_path, ["pwd"], working_dir="/usr/share/no-such-dir-gpufleet"))
    assert e.value.reason == "CreateContainerError"


async def test_log_file_is_cri_and_keeps_both_streams(rt, tmp_path):
    spec = make_spec(tmp_path, ["sh", "-c", "echo out1; echo err1 >&2; printf 'no newline'"])
    await rt.wait(await rt.start(spec))
    for _ in range(50):
        if len(read_cri_messages(spec.log_path)) == 3:
            break
        await asyncio.sleep(0.02)
    raw = raw_lines(spec.log_path)
    assert len(raw) == 3
    for line in raw:
        ts, stream, tag, _ = line.split(" ", 3)
        assert ts.endswith("Z") and len(ts.split(".")[1]) == 10  # nine digits and the Z
        assert stream in ("stdout", "stderr") and tag == "F"
    pairs = read_cri_messages(spec.log_path, with_streams=True)
    assert sorted(pairs) == sorted([("stdout", "out1"), ("stderr", "err1"), ("stdout", "no newline")])


async def test_restarts_append_to_their_own_log(rt, tmp_path):
    spec = make_spec(tmp_path, ["sh", "-c", "echo hi"])
    await rt.wait(await rt.start(spec))
    spec.attempt = 1
    await rt.wait(await rt.start(spec))
    await asyncio.sleep(0.05)
    assert read_cri_messages(spec.log_path) == ["hi", "hi"]


async def test_stop_sigterm_kills_a_program_without_a_handler_143(rt, tmp_path):
    spec = make_spec(tmp_path, ["sh", "-c", "echo ready; exec sleep 300"])
    h = await rt.start(spec)
    await wait_for_line(spec.log_path, "ready")
    st = await rt.stop(h, grace_seconds=10)
    assert (st.state, st.exit_code, st.reason, st.message) == ("exited", 143, "Error", "killed by SIGTERM")


async def test_stop_sigterm_within_grace(rt, tmp_path):
    spec = make_spec(
        tmp_path, ["sh", "-c", "trap 'echo bye; exit 0' TERM; echo ready; while true; do sleep 0.05; done"]
    )
    h = await rt.start(spec)
    await wait_for_line(spec.log_path, "ready")
    t0 = time.monotonic()
    st = await rt.stop(h, grace_seconds=10)
    assert time.monotonic() - t0 < 5
    assert (st.state, st.exit_code, st.reason) == ("exited", 0, "Completed")
    await wait_for_line(spec.log_path, "bye")


async def test_stop_sigkills_the_sandbox_after_grace(rt, tmp_path):
    marker = f"300.{os.getpid()}{time.monotonic_ns() % 100000}"
    code = (
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        # The grandchild ignores nothing, leaves the session, and must go all the same.
        f"p = subprocess.Popen(['sleep', {marker!r}], start_new_session=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    spec = make_spec(tmp_path, [PY, "-c", code])
    h = await rt.start(spec)
    await wait_for_line(spec.log_path, "ready")
    [grandchild] = processes_with(['sleep', marker])
    t0 = time.monotonic()
    st = await rt.stop(h, grace_seconds=0.5)
    elapsed = time.monotonic() - t0
    assert 0.4 <= elapsed < 5, elapsed
    assert (st.exit_code, st.reason) == (137, "Error")
    assert "SIGKILL" in st.message
    for _ in range(100):
        if gone(grandchild):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("grandchild survived stop()")


@pytest.mark.parametrize("sandboxed", [True, False])
async def test_processes_left_behind_die_with_the_main_one(tmp_path, sandboxed):
    rt = ProcessRuntime(tmp_path / "state", bwrap="bwrap" if sandboxed else None)
    marker = f"300.{os.getpid()}{time.monotonic_ns() % 100000}"
    try:
        spec = make_spec(tmp_path, ["sh", "-c", f"setsid sleep {marker} & sleep 0.3; echo started; exit 0"])
        st = await rt.wait(await rt.start(spec))
        assert st.exit_code == 0
        assert read_cri_messages(spec.log_path) == ["started"]
        for _ in range(100):
            if not processes_with(['sleep', marker]):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("background process outlived its container")
    finally:
        await rt.stop_all(1)
        await rt.close()


async def test_exec_uses_env_and_cwd(rt, tmp_path):
    wd = tmp_path / "wd"
    spec = make_spec(tmp_path, ["sleep", "300"], env={"FOO": "bar"}, working_dir=str(wd))
    h = await rt.start(spec)
    code, out = await rt.exec(h, ["sh", "-c", "echo $FOO; pwd; exit 2"], timeout=10)
    assert code == 2
    assert out.splitlines() == ["bar", str(wd)]
    code, out = await rt.exec(h, ["no-such-program-gpufleet"], timeout=10)
    assert code == 127
    t0 = time.monotonic()
    code, out = await rt.exec(h, ["sleep", "30"], timeout=0.3)
    assert code == -1 and "timed out" in out
    assert time.monotonic() - t0 < 5
    await rt.stop(h, 1)
    code, out = await rt.exec(h, ["true"], timeout=1)
    assert code == -1 and "not running" in out


async def test_stats_of_a_running_container(rt, tmp_path):
    spec = make_spec(tmp_path, [PY, "-c", "x = bytearray(30 * 1024 * 1024)\nwhile True: pass"])
    h = await rt.start(spec)
    await asyncio.sleep(0.5)
    first = await rt.stats(h)
    await asyncio.sleep(0.5)
    second = await rt.stats(h)
    assert first is not None and second is not None
    assert second.memory_bytes > 20 * 1024 * 1024
    # A busy loop keeps one core busy (the machine is shared, so leave room).
    assert second.cpu_millis > 200
    await rt.stop(h, 1)
    assert await rt.stats(h) is None


async def test_unknown_handle(rt):
    from gpufleet.agent.runtime.base import ContainerHandle

    h = ContainerHandle(id="nope")
    assert (await rt.state(h)).state == "unknown"
    assert (await rt.wait(h)).state == "unknown"
    assert await rt.stats(h) is None
    await rt.remove(h)


# --- cgroups -----------------------------------------------------------------------------


def _cgroup_v1_writable() -> bool:
    return all(os.access(f"/sys/fs/cgroup/{c}", os.W_OK) for c in ("cpu", "memory")) and all(
        os.path.exists(f"/sys/fs/cgroup/{c}/{f}")
        for c, f in (("cpu", "cpu.cfs_quota_us"), ("memory", "memory.limit_in_bytes"))
    )


async def test_memory_limit_leads_to_oomkilled(rt, tmp_path):
    if "memory" not in rt.limits_supported:
        # The machine does not let us enforce limits: the runtime must say so, not pretend.
        assert not _cgroup_v1_writable() or rt.cgroups is None
        assert rt.limits_unsupported_reason
        return
    code = "x = []\nwhile True: x.append(bytearray(8 * 1024 * 1024))\n"
    spec = make_spec(tmp_path, [PY, "-c", code], memory_limit_bytes=64 * 1024 * 1024, cpu_limit_millis=500)
    h = await rt.start(spec)
    st = await asyncio.wait_for(rt.wait(h), 60)
    assert (st.exit_code, st.reason) == (137, "OOMKilled"), st
    assert "memory limit" in st.message


async def test_limits_are_written_and_cgroups_removed(rt, tmp_path):
    if not rt.limits_supported:
        assert rt.limits_unsupported_reason
        return
    spec = make_spec(tmp_path, ["sleep", "300"], memory_limit_bytes=256 * 1024 * 1024, cpu_limit_millis=250)
    h = await rt.start(spec)
    rec = rt._containers[h.id]
    assert rec.cgroup is not None
    dirs = dict(rec.cgroup.dirs)
    if rec.cgroup.version == 1:
        assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "25000"
        assert (dirs["cpu"] / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert int((dirs["memory"] / "memory.limit_in_bytes").read_text()) == 256 * 1024 * 1024
    for d in dirs.values():
        assert f"gpufleet/{spec.pod_uid}/main/0" in str(d)
        # The sandbox joins its cgroups before it forks the program.
        for _ in range(100):
            if str(h.pid) in (d / "cgroup.procs").read_text().split():
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"{h.pid} never joined {d}")
    code, out = await rt.exec(h, ["sh", "-c", "cat /proc/self/cgroup"], timeout=10)
    assert code == 0 and spec.pod_uid in out
    await rt.stop(h, 1)
    await rt.remove(h)
    for d in dirs.values():
        assert not d.exists()
        assert not d.parent.parent.exists()  # the pod's directory went with its last container


async def test_without_writable_cgroups_limits_are_reported_unsupported(tmp_path):
    rt = ProcessRuntime(tmp_path / "state", cgroup_root=tmp_path / "no-cgroups")
    try:
        assert rt.limits_supported == frozenset()
        assert "no cgroup hierarchy" in rt.limits_unsupported_reason
        spec = make_spec(tmp_path, ["sh", "-c", "exit 0"], memory_limit_bytes=1024 * 1024)
        st = await rt.wait(await rt.start(spec))
        assert st.exit_code == 0
    finally:
        await rt.stop_all(1)
        await rt.close()


def test_cgroup_v2_layout(tmp_path):
    root = tmp_path / "cg2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    cgs = Cgroups(root)
    assert cgs.version == 2 and cgs.supported == {"cpu", "memory"}, cgs.reason
    cg = cgs.create(["uid-1", "main", "0"])
    assert cg is not None
    leaf = root / "gpufleet" / "uid-1" / "main" / "0"
    assert set(cg.dirs.values()) == {leaf}
    for d in (root, root / "gpufleet", root / "gpufleet" / "uid-1", root / "gpufleet" / "uid-1" / "main"):
        assert set((d / "cgroup.subtree_control").read_text().split()) == {"+cpu", "+memory"}
    cg.set_limits(1500, 1 << 30)
    assert (leaf / "cpu.max").read_text() == "150000 100000"
    assert (leaf / "memory.max").read_text() == str(1 << 30)
    cg.set_limits(None, None)
    assert (leaf / "cpu.max").read_text() == "max 100000"
    assert (leaf / "memory.max").read_text() == "max"
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cg.oom_kills() == 1
    assert cg.procs_files == [str(leaf / "cgroup.procs")]


def test_cgroup_v2_without_controllers(tmp_path):
    root = tmp_path / "cg2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("pids\n")
    cgs = Cgroups(root)
    assert cgs.supported == frozenset()
    assert "cpu controller is not available" in cgs.reason
    assert cgs.create(["a", "b", "0"]) is None
