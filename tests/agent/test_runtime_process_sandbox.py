"""The process runtime's sandbox, with real bubblewrap and real processes: users, hidden and
read-only paths, volumes, /etc/hosts and hostname, /dev/shm, PID namespaces, secrets in
the environment, GPUs' device nodes, exec, and containers that outlive the agent.

These run as root here (as the agent does on a node); the agent-not-root case runs a
second runtime under the unprivileged user in its own process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gpufleet.agent.runtime import monitor as mon
from gpufleet.agent.runtime.base import (
    ContainerHandle,
    ContainerSpec,
    GPUAssignment,
    HostAlias,
    Mount,
    RuntimeError_,
    SandboxHandle,
    SandboxSpec,
    SecuritySpec,
)
from gpufleet.agent.runtime.crilog import read_cri_messages
from gpufleet.agent.runtime.process import ProcessRuntime

PY = sys.executable
# The unprivileged user may not reach this interpreter's installation; the monitor needs
# only a standard library.
MONITOR_PY = "/usr/bin/python3.11" if os.path.exists("/usr/bin/python3.11") else PY
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (scripts/setup.sh)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as root on a node; these tests do too"),
]


def spec_for(tmp_path: Path, script: str, *, pod: str = "pod-a", name: str = "main", **kw) -> ContainerSpec:
    uid = kw.pop("pod_uid", f"uid-{pod}")
    attempt = kw.pop("attempt", 0)
    return ContainerSpec(
        pod_uid=uid,
        pod_name=pod,
        namespace="default",
        name=name,
        image="host",
        command=kw.pop("command", ["sh", "-c", script]),
        args=[],
        env=kw.pop("env", {}),
        working_dir=kw.pop("working_dir", None),
        log_path=str(tmp_path / "logs" / uid / name / f"{attempt}.log"),
        attempt=attempt,
        **kw,
    )


async def run(rt: ProcessRuntime, spec: ContainerSpec) -> tuple[int, list[str]]:
    st = await rt.wait(await rt.start(spec))
    assert st.exit_code is not None
    return st.exit_code, read_cri_messages(spec.log_path)


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie), also when it goes between two looks."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def until(check, within_s: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_for_line(path: str, text: str) -> None:
    await until(lambda: any(text in m for m in read_cri_messages(path)), what=f"{text!r} in {path}")


def write(path: str, text: str) -> None:
    Path(path).write_text(text)


def remove(path: str) -> None:
    Path(path).unlink()


def mounted_or_there(path: str) -> bool:
    return os.path.ismount(path) or os.path.exists(path)


def writable_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


async def cleanup(runtime: ProcessRuntime) -> None:
    """What the agent does when a test's pods go: containers stopped, sandboxes (and
    their /dev/shm mounts) removed."""
    await runtime.stop_all(1)
    for sid in list(runtime._sandboxes):
        await runtime.remove_sandbox(SandboxHandle(id=sid))
    await runtime.close()


@pytest.fixture
async def rt(tmp_path):
    runtime = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    yield runtime
    await cleanup(runtime)


# --- users -------------------------------------------------------------------------------


async def test_run_as_user_group_and_supplemental_groups(rt, tmp_path):
    sec = SecuritySpec(run_as_user=1234, run_as_group=2345, supplemental_groups=(3456, 4567), fs_group=5678)
    code, out = await run(rt, spec_for(tmp_path, "id -u; id -g; id -G; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status",
                                       security=sec))
    assert code == 0, out
    assert out[0] == "1234" and out[1] == "2345"
    assert set(out[2].split()) == {"2345", "3456", "4567", "5678"}
    assert out[3].split() == ["CapEff:", "0000000000000000"]
    assert out[4].split() == ["NoNewPrivs:", "1"]


async def test_the_default_user_is_unprivileged(rt, tmp_path):
    code, out = await run(rt, spec_for(tmp_path, "id -u; id -g; id -G; grep CapEff /proc/self/status; echo $HOME"))
    assert code == 0
    assert out == ["65534", "65534", "65534", "CapEff:\t0000000000000000", "/nonexistent"]
    other = ProcessRuntime(tmp_path / "state2", cgroup_root=None, default_user=(4321, 4322))
    try:
        _, out = await run(other, spec_for(tmp_path, "id -u; id -g", pod="pod-b"))
        assert out == ["4321", "4322"]
    finally:
        await other.close()
    with pytest.raises(ValueError, match="must not be root"):
        ProcessRuntime(tmp_path / "state3", default_user=(0, 0))


async def test_uid_0_without_privileged_is_root_only_in_a_user_namespace(rt, tmp_path):
    d = writable_dir(tmp_path / "vol")
    code, out = await run(rt, spec_for(
        tmp_path,
        "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status; touch /vol/made-by-root; "
        "cat /etc/shadow >/dev/null 2>&1 && echo read-shadow || echo no-shadow",
        security=SecuritySpec(run_as_user=0, capabilities_drop=("NET_RAW",), capabilities_add=("NET_ADMIN",)),
        mounts=[Mount(str(d), "/vol")],
    ))
    assert code == 0, out
    assert out[0] == "0"
    assert out[1].split() == ["0", "65534", "1"]
    caps = int(out[2].split()[1], 16)
    # The default container set, less NET_RAW (13), plus NET_ADMIN (12).
    assert caps & (1 << 12) and not caps & (1 << 13) and caps & (1 << 0)  # CHOWN
    assert not caps & (1 << 21)  # no SYS_ADMIN
    # Its files are the unprivileged user's on the node, and the node's secrets stay closed.
    assert (d / "made-by-root").stat().st_uid == 65534
    assert out[3] == "no-shadow"


async def test_privileged_is_root_on_the_node(rt, tmp_path):
    code, out = await run(rt, spec_for(tmp_path, "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status",
                                       security=SecuritySpec(privileged=True)))
    assert code == 0
    assert out[0] == "0"
    assert out[1].split() == ["0", "0", "4294967295"]
    assert int(out[2].split()[1], 16) & (1 << 21)  # SYS_ADMIN


async def test_a_program_the_user_may_not_run_is_passed_over_on_path(rt, tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    prog = closed / "true"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o755)
    vol = [Mount(str(closed), "/closed")]
    # Named by its path it is run, and the kernel says no (exec, or its shell reading it:
    # some VM filesystems let exec through a closed directory).
    code, out = await run(rt, spec_for(tmp_path, "", command=["/closed/true"], mounts=vol))
    assert code != 0 and "Permission denied" in out[-1], out
    # On PATH, an entry the user may not enter is passed over, as its shell would.
    code, out = await run(rt, spec_for(tmp_path, "", command=["true"], mounts=vol,
                                       env={"PATH": "/closed:/usr/bin:/bin"}, name="on-path"))
    assert code == 0, out
    # Root may.
    code, _ = await run(rt, spec_for(tmp_path, "", command=["/closed/true"], mounts=vol, name="root",
                                     security=SecuritySpec(privileged=True)))
    assert code == 0


async def test_run_as_non_root_is_refused_in_kubernetes_words(rt, tmp_path):
    with pytest.raises(RuntimeError_, match=r"container's runAsUser breaks non-root policy \(pod: ") as e:
        await rt.start(spec_for(tmp_path, "true", security=SecuritySpec(run_as_user=0, run_as_non_root=True)))
    assert e.value.reason == "CreateContainerConfigError"
    with pytest.raises(RuntimeError_, match="container has runAsNonRoot and image will run as root"):
        await rt.start(spec_for(tmp_path, "true", security=SecuritySpec(privileged=True, run_as_non_root=True)))
    # A non-root user passes.
    code, _ = await run(rt, spec_for(tmp_path, "true", security=SecuritySpec(run_as_non_root=True)))
    assert code == 0


async def test_unknown_capability_is_refused(rt, tmp_path):
    with pytest.raises(RuntimeError_, match="capabilities.add: unknown capability 'FLY'"):
        await rt.start(spec_for(tmp_path, "true", security=SecuritySpec(run_as_user=0, capabilities_add=("FLY",))))


def test_capabilities_say_what_this_machine_honours(tmp_path):
    rt = ProcessRuntime(tmp_path / "s1", cgroup_root=None)
    assert rt.capabilities == {"run-as-user", "capabilities", "mounts", "read-only-rootfs", "pid-namespace", "shm-size"}
    assert "images" not in rt.capabilities and "pod-network" not in rt.capabilities
    bare = ProcessRuntime(tmp_path / "s2", cgroup_root=None, bwrap=None)
    assert bare.capabilities == {"run-as-user", "capabilities"}
    assert "disabled" in bare.sandbox_unsupported_reason
    missing = ProcessRuntime(tmp_path / "s3", cgroup_root=None, bwrap="no-such-bwrap-gpufleet")
    assert "not installed" in missing.sandbox_unsupported_reason and "mounts" not in missing.capabilities


def test_an_agent_that_is_not_root_runs_everything_as_itself(tmp_path):
    """A second runtime, in its own process, as the unprivileged user."""
    # Not under /tmp, which a sandbox does not show at all.
    base = Path(f"/var/tmp/gpufleet-nonroot-{os.getpid()}-{time.monotonic_ns()}")
    base.mkdir(mode=0o777)
    base.chmod(0o777)
    script = textwrap.dedent(f"""
        import asyncio, json, os
        from gpufleet.agent.runtime.base import ContainerSpec, SecuritySpec
        from gpufleet.agent.runtime.crilog import read_cri_messages
        from gpufleet.agent.runtime.process import ProcessRuntime

        async def main():
            rt = ProcessRuntime({str(base / 'state')!r}, cgroup_root=None, hidden_paths=[{str(base / 'secret')!r}],
                                monitor_python={MONITOR_PY!r})
            spec = ContainerSpec("u", "p", "default", "main", "host",
                                 ["sh", "-c", "id -u; ls /proc | grep -c '^[0-9]'; ls -A {base / 'secret'}"], [], {{}}, None,
                                 log_path={str(base / 'log')!r}, security=SecuritySpec(run_as_user=1234))
            st = await rt.wait(await rt.start(spec))
            print(json.dumps({{"caps": sorted(rt.capabilities), "code": st.exit_code,
                              "out": read_cri_messages({str(base / 'log')!r})}}))
        asyncio.run(main())
        """)
    try:
        (base / "secret").mkdir()
        (base / "secret" / "key").write_text("x")
        p = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY, "-c", script],
            capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
            cwd="/",
        )
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout.strip().splitlines()[-1])
        assert "run-as-user" not in got["caps"] and "capabilities" not in got["caps"]
        assert "mounts" in got["caps"] and "pid-namespace" in got["caps"]
        assert got["code"] == 0, got
        # The agent's own user, whatever the pod asked; its own processes only (bwrap's
        # init, sh, and the pipeline); the hidden directory empty.
        assert got["out"][0] == "65534" and int(got["out"][1]) <= 4 and got["out"][2:] == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- files -------------------------------------------------------------------------------


async def test_hidden_paths_and_the_state_dir_are_empty_inside(tmp_path):
    tmp_path.chmod(0o755)
    agent_state = tmp_path / "agent-state"
    cp_state = tmp_path / "cp-state"
    for d in (agent_state, cp_state):
        d.mkdir()
        (d / "token").write_text("very secret")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("admin credentials")
    rt = ProcessRuntime(tmp_path / "rt-state", cgroup_root=None, shared_paths=[tmp_path],
                        hidden_paths=[agent_state, cp_state, kubeconfig])
    try:
        # Another pod's sandbox, with its files, under the runtime's state dir.
        await rt.run_sandbox(SandboxSpec("uid-other", "other", "default", "other", directory=""))
        script = (f"ls -A {agent_state} {cp_state} {tmp_path / 'rt-state'}; wc -c < {kubeconfig}; "
                  f"ls {tmp_path}; touch {agent_state}/x || echo read-only")
        code, out = await run(rt, spec_for(tmp_path, script, security=SecuritySpec(run_as_user=0, privileged=True)))
        assert code == 0, out
        touch = f"touch: cannot touch '{agent_state}/x': Read-only file system"
        # (stderr's line may come anywhere among stdout's)
        assert touch in out
        out.remove(touch)
        assert out == [f"{agent_state}:", "", f"{cp_state}:", "", f"{tmp_path / 'rt-state'}:", "0",
                       "agent-state", "cp-state", "kubeconfig", "logs", "rt-state", "read-only"]
        assert (agent_state / "token").read_text() == "very secret"
        # Seen through a volume of a directory above them, they are hidden all the same.
        code, out = await run(rt, spec_for(tmp_path, "ls -A /host/agent-state /host/rt-state; cat /host/kubeconfig",
                                           name="through-volume", mounts=[Mount(str(tmp_path), "/host")]))
        assert out == ["/host/agent-state:", "", "/host/rt-state:"], out
    finally:
        await cleanup(rt)


async def test_mounts_read_only_and_read_write_files_and_directories(rt, tmp_path):
    rw = writable_dir(tmp_path / "rw")
    ro = writable_dir(tmp_path / "ro")
    (ro / "data").write_text("kept")
    single = tmp_path / "config.yaml"
    single.write_text("key: value\n")
    single.chmod(0o644)
    script = ("echo hello > /data/rw/new && echo wrote-rw; "
              "echo no > /data/ro/data || echo ro-refused; cat /data/ro/data; echo; "
              "cat /config.yaml; echo x > /config.yaml || echo file-ro; "
              "touch /usr/gpufleet-test || echo node-ro")
    code, out = await run(rt, spec_for(tmp_path, script, mounts=[
        Mount(str(rw), "/data/rw"), Mount(str(ro), "/data/ro", read_only=True),
        Mount(str(single), "/config.yaml", read_only=True),
    ]))
    assert (rw / "new").read_text() == "hello\n"
    assert (ro / "data").read_text() == "kept"
    assert "wrote-rw" in out and "ro-refused" in out and "kept" in out and "key: value" in out
    assert "file-ro" in out and "node-ro" in out
    assert code == 0


async def test_a_mount_point_deep_in_the_read_only_node_is_made_on_a_copy_of_its_directory(rt, tmp_path):
    d = writable_dir(tmp_path / "v")
    write(str(d / "f"), "in the volume\n")
    # Where every pod's service account token goes: /var/run is a symlink to /run on the node,
    # and neither has secrets/: the container sees a copy of /run with the mount point in it.
    code, out = await run(rt, spec_for(
        tmp_path, "cat /var/run/secrets/kubernetes.io/serviceaccount/f; cat /usr/no/such/place/f; "
                  "ls /usr/bin/env && touch /usr/x 2>/dev/null || echo usr-ro; touch /run/x 2>/dev/null || echo run-ro",
        mounts=[Mount(str(d), "/var/run/secrets/kubernetes.io/serviceaccount"),
                Mount(str(d), "/usr/no/such/place")]))
    assert code == 0 and out == ["in the volume", "in the volume", "/usr/bin/env", "usr-ro", "run-ro"], out
    # The node's directories were not touched.
    assert not await asyncio.to_thread(os.path.exists, "/usr/no")
    assert not await asyncio.to_thread(os.path.exists, "/run/secrets")


async def test_a_mount_point_the_container_cannot_hold_fails_the_start(rt, tmp_path):
    d = writable_dir(tmp_path / "v")
    with pytest.raises(RuntimeError_, match="/proc is part of the node's filesystem") as e:
        await rt.start(spec_for(tmp_path, "true", mounts=[Mount(str(d), "/proc/no/such/place")]))
    assert e.value.reason == "CreateContainerError"
    # What bwrap itself refuses comes back with its words.
    with pytest.raises(RuntimeError_, match="cannot set up the container's sandbox: bwrap: ") as e:
        await rt.start(spec_for(tmp_path, "true", mounts=[Mount(str(d), "/etc/passwd")]))
    assert e.value.reason == "RunContainerError"
    with pytest.raises(RuntimeError_, match="does not exist"):
        await rt.start(spec_for(tmp_path, "true", mounts=[Mount(str(tmp_path / "nope"), "/data")]))


async def test_read_only_root_filesystem(rt, tmp_path):
    code, out = await run(rt, spec_for(
        tmp_path, "touch /tmp/x || echo tmp-ro; echo y > /dev/shm/y && echo shm-rw",
        security=SecuritySpec(read_only_root_filesystem=True),
    ))
    # stderr and stdout are two pipes: their lines may interleave either way.
    assert sorted(out) == sorted(["touch: cannot touch '/tmp/x': Read-only file system", "tmp-ro", "shm-rw"])


async def test_tmp_is_private_and_fresh(rt, tmp_path):
    # Named per run: another test session on this machine may be here at the same time.
    node_file = f"/tmp/gpufleet-node-file-{os.getpid()}"
    write(node_file, "node")
    try:
        _, out = await run(rt, spec_for(tmp_path, "ls -A /tmp; echo mine > /tmp/f; cat /tmp/f"))
        assert out == ["mine"]
        _, out = await run(rt, spec_for(tmp_path, "ls -A /tmp", attempt=1))
        assert out == []
    finally:
        remove(node_file)


# --- pod sandbox: hosts, hostname, shm ------------------------------------------------------


async def test_etc_hosts_and_hostname_are_the_pods(rt, tmp_path):
    handle = await rt.run_sandbox(SandboxSpec(
        "uid-web", "web-0", "default", "web-0", directory="",
        hosts=[HostAlias("10.1.2.3", ("db", "db.internal")), HostAlias("10.1.2.4", ("cache",))],
        dns_servers=["10.0.0.10"],
    ))
    again = await rt.run_sandbox(SandboxSpec("uid-web", "web-0", "default", "web-0", directory=""))
    assert again.id == handle.id
    code, out = await run(rt, spec_for(tmp_path, "hostname; cat /etc/hostname; cat /etc/hosts; "
                                                 "grep nameserver /etc/resolv.conf; echo $HOSTNAME",
                                       pod="web-0", pod_uid="uid-web", sandbox=handle))
    assert code == 0
    assert out[0] == "web-0" and out[1] == "web-0"
    assert out[2] == "# Kubernetes-managed hosts file (host network)."
    assert "127.0.0.1\tlocalhost" in out
    assert any(re.fullmatch(r"\S+\tweb-0", ln) for ln in out)
    i = out.index("# Entries added by HostAliases.")
    assert out[i + 1:i + 3] == ["10.1.2.3\tdb db.internal", "10.1.2.4\tcache"]
    assert "nameserver 10.0.0.10" in out
    assert out[-1] == "web-0"
    # Without a sandbox (an agent that does not make them yet): the pod's name all the same.
    _, out = await run(rt, spec_for(tmp_path, "hostname; grep -c HostAliases /etc/hosts", pod="lone"))
    assert out == ["lone", "0"]


async def test_containers_of_one_pod_share_dev_shm_and_other_pods_do_not(rt, tmp_path):
    a = await rt.run_sandbox(SandboxSpec("uid-a", "a", "default", "a", directory="", shm_size_bytes=8 << 20))
    b = await rt.run_sandbox(SandboxSpec("uid-b", "b", "default", "b", directory=""))
    writer = spec_for(tmp_path, "echo from-a1 > /dev/shm/seg; df -k /dev/shm | tail -1", pod="a", pod_uid="uid-a",
                      name="one", sandbox=a)
    code, out = await run(rt, writer)
    assert code == 0
    # The pod's shm is a tmpfs of the size asked for (8 MiB).
    assert out[0].split()[1] == str(8 << 10)
    _, out = await run(rt, spec_for(tmp_path, "cat /dev/shm/seg", pod="a", pod_uid="uid-a", name="two", sandbox=a))
    assert out == ["from-a1"]
    _, out = await run(rt, spec_for(tmp_path, "ls -A /dev/shm; df -k /dev/shm | tail -1", pod="b", pod_uid="uid-b",
                                    sandbox=b))
    assert out[0].split()[1] == str(64 << 10)  # the default, 64 MiB
    # Sandbox-less containers each get a private one.
    _, out = await run(rt, spec_for(tmp_path, "echo x > /dev/shm/seg", pod="c", name="one"))
    _, out = await run(rt, spec_for(tmp_path, "ls -A /dev/shm", pod="c", name="two"))
    assert out == []
    shm = rt._sandboxes["uid-a"].record["shm_dir"]
    await rt.remove_sandbox(a)
    assert not mounted_or_there(shm)


# --- processes and secrets -----------------------------------------------------------------


async def test_a_pod_sees_only_its_own_processes(rt, tmp_path):
    other = await rt.start(spec_for(tmp_path, "exec sleep 300", pod="neighbour"))
    code, out = await run(rt, spec_for(tmp_path, "ls /proc | grep '^[0-9]' | sort -n | tr '\\n' ' '; echo; ps -e -o pid=,comm="))
    assert code == 0
    assert out[0].split() == ["1", "2", "3", "4", "5", "6"][: len(out[0].split())]
    assert len(out[0].split()) <= 6
    assert not any("sleep" in ln for ln in out[1:]), out
    assert psutil.pid_exists(other.pid)


async def test_secrets_in_the_environment_reach_no_command_line_and_no_other_pod(rt, tmp_path):
    token = "s3cr3t-" + os.urandom(8).hex()
    holder = spec_for(tmp_path, "echo ready; exec sleep 300", pod="holder", env={"API_TOKEN": token})
    h = await rt.start(holder)
    await wait_for_line(holder.log_path, "ready")
    # The program has it, through exec.
    code, out = await rt.exec(h, ["sh", "-c", "echo $API_TOKEN"], 10)
    assert (code, out.strip()) == (0, token)
    # No process on the node carries it on its command line (the monitor, bwrap, setpriv...).
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            assert token not in "\0".join(p.info["cmdline"] or []), p.info["cmdline"]
    # Another pod cannot see the holder's pid, so not its environ either, even as root in its
    # user namespace; nothing it can read anywhere in /proc holds the token.
    # (The probe names the token in two halves, so its own command line does not hold it.)
    half = len(token) // 2
    find = "grep -c -f /dev/shm/pattern"
    probe = (f"printf %s%s {token[:half]} {token[half:]} > /dev/shm/pattern; test -e /proc/{h.pid} && echo sees-pid || echo no-pid; "
             f"cat /proc/{h.pid}/environ 2>/dev/null | tr '\\0' '\\n' | {find}; "
             f"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | {find}")
    _, out = await run(rt, spec_for(tmp_path, probe, pod="snoop", security=SecuritySpec(run_as_user=0)))
    assert out == ["no-pid", "0", "0"]
    # Nor does the state the runtime keeps on disk.
    for f in (tmp_path / "state").rglob("*"):
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f


# --- GPUs --------------------------------------------------------------------------------


async def test_only_the_assigned_gpus_device_nodes(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).write_text("")
    rt = ProcessRuntime(tmp_path / "state", cgroup_root=None, device_dir=dev)
    try:
        code, out = await run(rt, spec_for(
            tmp_path, "ls /dev | grep nvidia | tr '\\n' ' '; echo; echo $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES",
            gpus=[GPUAssignment(1, "GPU-b"), GPUAssignment(3, "GPU-d")],
        ))
        assert code == 0
        assert out[0].split() == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidia3", "nvidiactl"]
        # CUDA numbers the GPUs it sees from 0.
        assert out[1] == "0,1 GPU-b,GPU-d"
        _, out = await run(rt, spec_for(tmp_path, "ls /dev | grep -c nvidia", name="cpu-only"))
        assert out == ["0"]
    finally:
        await cleanup(rt)


# --- exec --------------------------------------------------------------------------------


async def test_exec_runs_inside_the_sandbox(rt, tmp_path):
    sb = await rt.run_sandbox(SandboxSpec("uid-x", "x-0", "default", "x-0", directory=""))
    spec = spec_for(tmp_path, "echo ready; exec sleep 300", pod="x-0", pod_uid="uid-x", sandbox=sb,
                    env={"FOO": "bar"}, working_dir="/tmp/work", security=SecuritySpec(run_as_user=1500))
    h = await rt.start(spec)
    await wait_for_line(spec.log_path, "ready")
    code, out = await rt.exec(h, ["sh", "-c", "id -u; hostname; pwd; echo $FOO; ls /proc | grep -c '^[0-9]'; "
                                              "grep NoNewPrivs /proc/self/status"], 10)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:4] == ["1500", "x-0", "/tmp/work", "bar"]
    assert int(lines[4]) <= 5  # init, sleep, and the exec's own few
    assert lines[5].split() == ["NoNewPrivs:", "1"]
    assert (await rt.exec(h, ["no-such-program-gpufleet"], 10))[0] == 127


async def test_exec_stream_is_interactive(rt, tmp_path):
    spec = spec_for(tmp_path, "echo ready; exec sleep 300")
    h = await rt.start(spec)
    await wait_for_line(spec.log_path, "ready")
    s = await rt.exec_stream(h, ["sh"])
    s.stdin.write(b"echo hi $(id -u)\nexit 4\n")
    await s.stdin.drain()
    assert (await s.stdout.readline()).strip() == b"hi 65534"
    assert await s.wait() == 4
    # A terminal of the container's own /dev/pts, resized before the command looks.
    t = await rt.exec_stream(h, ["sh", "-c", "read go; tty; stty size"], tty=True)
    t.resize(33, 101)
    t.stdin.write(b"go\n")
    await t.stdin.drain()
    out = b""
    with contextlib.suppress(OSError):
        while chunk := await asyncio.wait_for(t.stdout.read(1024), 10):
            out += chunk
    assert await t.wait() == 0
    lines = out.decode().replace("\r", "").split("\n")
    assert re.fullmatch(r"/dev/pts/\d+", lines[1]) and lines[2] == "33 101", lines


# --- lifetime and recovery ---------------------------------------------------------------


async def test_the_monitor_is_detached_and_close_leaves_containers_running(tmp_path):
    rt = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    spec = spec_for(tmp_path, "echo ready; exec sleep 300")
    h = await rt.start(spec)
    rec = rt._containers[h.id]
    m = psutil.Process(rec.monitor.pid)
    assert m.ppid() != os.getpid() and os.getsid(m.pid) != os.getsid(0)
    await rt.close()
    assert psutil.pid_exists(h.pid)
    state = mon.read_state(str(rec.dir))
    assert state["phase"] == "running" and oct((rec.dir / mon.STATE).stat().st_mode & 0o777) == "0o600"
    again = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    _, containers = await again.recover("")
    await cleanup(again)


async def test_recover_after_the_agent_vanished(tmp_path):
    flags = writable_dir(tmp_path / "flags")
    first = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    sb = await first.run_sandbox(SandboxSpec("uid-train", "train-0", "default", "train-0", directory="", gpus=[2, 3]))
    waiter = spec_for(tmp_path, "echo ready; while [ ! -e /flags/go ]; do sleep 0.05; done; exit 7",
                      pod="train-0", pod_uid="uid-train", attempt=2, sandbox=sb, node_name="n1",
                      gpus=[GPUAssignment(2, "GPU-c"), GPUAssignment(3, "GPU-d")], mounts=[Mount(str(flags), "/flags")])
    stubborn = spec_for(tmp_path, "trap '' TERM; echo ready; while true; do sleep 0.05; done",
                        pod="train-0", pod_uid="uid-train", name="sidecar", sandbox=sb, node_name="n1")
    h1 = await first.start(waiter)
    h2 = await first.start(stubborn)
    await wait_for_line(waiter.log_path, "ready")
    await wait_for_line(stubborn.log_path, "ready")
    # The agent is gone without a word: nothing closed, nothing stopped.
    for rec in first._containers.values():
        assert rec.watcher is not None
        rec.watcher.cancel()
    del first

    rt = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    try:
        sandboxes, containers = await rt.recover("n1")
        assert [(s.pod_uid, s.pod_name, s.gpus) for s in sandboxes] == [("uid-train", "train-0", (2, 3))]
        by_name = {c.name: c for c in containers}
        assert set(by_name) == {"main", "sidecar"}
        main, side = by_name["main"], by_name["sidecar"]
        assert (main.pod_uid, main.attempt, main.gpus, main.state.state) == ("uid-train", 2, (2, 3), "running")
        assert main.handle.id == h1.id and main.handle.pid == h1.pid and main.sandbox_id == sb.id
        assert main.log_path == waiter.log_path and main.namespace == "default" and main.pod_name == "train-0"
        assert side.state.state == "running" and side.handle.pid == h2.pid
        # Another node's agent sharing the state dir does not get them.
        other = ProcessRuntime(tmp_path / "state", cgroup_root=None)
        assert (await other.recover("n2"))[1] == []
        await other.close()

        code, out = await rt.exec(main.handle, ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES; hostname"], 10)
        assert (code, out.split()) == (0, ["2,3", "train-0"])
        assert await rt.stats(main.handle) is not None
        waiting = asyncio.ensure_future(rt.wait(main.handle))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        (flags / "go").write_text("")
        st = await asyncio.wait_for(waiting, 15)
        assert (st.state, st.exit_code, st.reason) == ("exited", 7, "Error")
        st = await rt.stop(side.handle, 0.3)
        assert (st.exit_code, st.message) == (137, "killed by SIGKILL")
        await rt.remove(main.handle)
        assert (await rt.state(main.handle)).state == "unknown"
    finally:
        await cleanup(rt)


AGENT = """
import asyncio, json, sys
from gpufleet.agent.runtime.base import ContainerSpec, GPUAssignment, Mount
from gpufleet.agent.runtime.process import ProcessRuntime

async def main():
    state, logs, flags = sys.argv[1:4]
    rt = ProcessRuntime(state, cgroup_root=None)
    specs = [
        ContainerSpec("uid-p", "p", "default", "waits", "host",
                      ["sh", "-c", "while [ ! -e /flags/go ]; do sleep 0.05; done; exit 3"], [], {}, None,
                      gpus=[GPUAssignment(1, "GPU-b")], log_path=logs + "/waits.log", attempt=4, node_name="n1",
                      mounts=[Mount(flags, "/flags")]),
        ContainerSpec("uid-p", "p", "default", "runs", "host", ["sleep", "300"], [], {}, None,
                      log_path=logs + "/runs.log", node_name="n1"),
    ]
    handles = [await rt.start(s) for s in specs]
    print(json.dumps([h.id for h in handles]), flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


async def test_recover_after_the_agent_process_was_sigkilled(tmp_path):
    flags = writable_dir(tmp_path / "flags")
    logs = tmp_path / "logs"
    agent = await asyncio.create_subprocess_exec(
        PY, "-c", AGENT, str(tmp_path / "state"), str(logs), str(flags),
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert agent.stdout is not None
    ids = json.loads(await asyncio.wait_for(agent.stdout.readline(), 60))
    agent.kill()
    await agent.wait()
    # While no agent runs, one container ends.
    (flags / "go").write_text("")
    rt = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    try:
        async def ended():
            _, cs = await rt.recover("n1")
            return {c.name: c for c in cs} if any(c.state.state == "exited" for c in cs) else None

        deadline = time.monotonic() + 15
        while (got := await ended()) is None:
            assert time.monotonic() < deadline, "the waiting container never ended"
            await asyncio.sleep(0.1)
        assert {c.handle.id for c in got.values()} == set(ids)
        waits, runs = got["waits"], got["runs"]
        assert (waits.state.state, waits.state.exit_code, waits.attempt, waits.gpus) == ("exited", 3, 4, (1,))
        assert runs.state.state == "running"
        # Its output was logged by the monitor while no agent was there.
        st = await rt.stop(runs.handle, 5)
        assert (st.exit_code, st.reason) == (143, "Error")
    finally:
        await cleanup(rt)


async def test_a_container_whose_monitor_died_is_status_unknown(tmp_path):
    first = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    spec = spec_for(tmp_path, "echo ready; exec sleep 300")
    h = await first.start(spec)
    await wait_for_line(spec.log_path, "ready")
    monitor_pid = first._containers[h.id].monitor.pid
    await first.close()
    os.kill(monitor_pid, signal.SIGKILL)
    # The sandbox goes with its monitor: nobody would be left to record its end.
    await until(lambda: gone(h.pid),
                what="the container to follow its monitor")
    rt = ProcessRuntime(tmp_path / "state", cgroup_root=None)
    try:
        _, [c] = await rt.recover("")
        assert (c.state.state, c.state.exit_code, c.state.reason) == ("exited", 137, "ContainerStatusUnknown")
        assert (await rt.wait(c.handle)).reason == "ContainerStatusUnknown"
    finally:
        await rt.close()


async def test_a_failed_start_leaves_nothing_to_recover(rt, tmp_path):
    with pytest.raises(RuntimeError_):
        await rt.start(spec_for(tmp_path, "true", mounts=[Mount(str(writable_dir(tmp_path / "v")), "/proc/x/y")]))
    assert await rt.recover("") == ([], [])
    h = ContainerHandle(id="not/a/container")
    assert (await rt.state(h)).state == "unknown"


# --- images ------------------------------------------------------------------------------


async def test_images_mean_the_host(rt):
    assert rt.image_honoured("host") and rt.image_honoured("localhost/gpufleet/host:latest")
    assert not rt.image_honoured("python:3.12")
    pulled = await rt.ensure_image("python:3.12", "Always", [])
    assert pulled.pulled is False
    custom = ProcessRuntime(rt.state_dir, cgroup_root=None, host_images=("bare-metal",))
    assert custom.image_honoured("bare-metal") and not custom.image_honoured("host")


def test_a_sandbox_probe_that_fails_once_does_not_turn_sandboxing_off(tmp_path):
    """bwrap's probe binds all of / recursively: a mount that vanishes meanwhile (another pod's
    volume unmounted) fails it once. Only a failure that repeats turns sandboxing off."""
    from gpufleet.agent.runtime.process_host import _probe_bwrap

    count = tmp_path / "count"
    flaky = tmp_path / "bwrap-flaky"
    flaky.write_text(f"#!/bin/sh\necho x >> {count}\n[ $(wc -l < {count}) -gt 1 ] && exit 0\n"
                     "echo \"bwrap: Can't bind mount /oldroot/ on /newroot/: No such file or directory\" >&2\nexit 1\n")
    flaky.chmod(0o755)
    assert _probe_bwrap(str(flaky)) == (str(flaky), "")
    assert count.read_text().count("x") == 2
    broken = tmp_path / "bwrap-broken"
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    broken.chmod(0o755)
    path, reason = _probe_bwrap(str(broken))
    assert path is None and "No permissions to create new namespace" in reason
