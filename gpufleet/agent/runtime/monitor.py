"""The per-container monitor of the process runtime (what conmon or containerd-shim are to
other runtimes): ``python -m gpufleet.agent.runtime.monitor DIR``.

The agent writes the container's launch (JSON, environment included) to its stdin. The
monitor detaches (a fork and a session of its own, so it outlives the agent), starts the
sandbox, tells the agent on stdout (one JSON line: the pids, or why it could not start),
then writes the program's stdout and stderr to the container's log in the CRI format
until it exits, and records in DIR/state.json (mode 0600, replaced atomically) who the
container is, its pids with their start times, and how it ended. It exits with the
container. The environment is never on a command line: the agent hands it over on a
pipe and it reaches the program through exec.

A pid alone is not an identity (pids are reused); a pid with its start time from
/proc/<pid>/stat (clock ticks since boot) is.

Standard library only, and little of it: it starts once per container, so what it
imports is start latency (json, typing and signal's enums would add about 15 ms here):
the launch comes as marshal data, the state file is written by _dumps, and signals come
from _signal, the C module under signal.
"""

from __future__ import annotations

import _signal as signal
import marshal
import os
import select
import sys
import time

STATE = "state.json"
_DRAIN_S = 5.0


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state letter, start time) of a live process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields start after the last ")".
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return int(rest[1]), rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    st = proc_stat(pid)
    return None if st is None or st[1] in ("Z", "X") else st[2]


def alive(pid: int | None, started: int | None) -> bool:
    return pid is not None and started is not None and start_time(pid) == started


_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t"})


def _dumps(v) -> str:
    """JSON of what a state holds (dicts, lists, strings, numbers, booleans, None)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.translate(_ESCAPES) + '"'
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_dumps(str(k))}: {_dumps(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_dumps(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to a state file")


def write_state(directory: str, state: dict) -> None:
    path = os.path.join(directory, STATE)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, _dumps(state).encode())
        if state.get("phase") in ("exited", "failed"):
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_state(directory: str) -> dict | None:
    """For the agent (the monitor itself never reads one)."""
    import json

    try:
        with open(os.path.join(directory, STATE), "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _child_pid(status_line: bytes) -> int | None:
    """The sandbox init's pid from bwrap's first status line: { "child-pid": 123, ... }."""
    _, sep, rest = status_line.partition(b'"child-pid":')
    digits = rest.lstrip().split(b",")[0].split(b"}")[0].strip()
    return int(digits) if sep and digits.isdigit() else None


def _first_child(ppid: int) -> int | None:
    """A child of ppid. What ppid just forked usually has the next pids, so those are
    looked at first."""
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    for p in sorted(p for p in pids if p > ppid) + sorted(p for p in pids if p < ppid):
        st = proc_stat(p)
        if st is not None and st[0] == ppid:
            return p
    return None


def _read_line(fd: int, limit: int = 65536) -> bytes:
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < limit:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf


def _oom_kills(path: str | None) -> int:
    if not path:
        return 0
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _spawn(argv: list[str], env: dict[str, str], cwd: str, out_w: int, err_w: int, keep: list[int],
           cgroup_procs: list[str], new_session: bool) -> int:
    """fork and exec, with a pipe that carries exec's failure back (as subprocess does,
    without importing it)."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rd)
            # Python ignores SIGPIPE (and this monitor SIGHUP/SIGINT); exec keeps ignored
            # signals ignored, so the program gets the defaults back.
            for sig in (signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in keep:
                os.set_inheritable(fd, True)
            if new_session:
                os.setsid()
            for f in cgroup_procs:
                with open(f, "w") as cg:
                    cg.write(str(os.getpid()))
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        except BaseException as e:  # noqa: BLE001 - whatever it was goes to the parent
            msg = f"{argv[0]}: {getattr(e, 'strerror', None) or e}"
            os.write(wr, msg.encode(errors="replace"))
        finally:
            os._exit(127)
    os.close(wr)
    err = b""
    while True:
        chunk = os.read(rd, 4096)
        if not chunk:
            break
        err += chunk
    os.close(rd)
    if err:
        os.waitpid(pid, 0)
        raise OSError(err.decode(errors="replace"))
    return pid


class Monitor:
    def __init__(self, directory: str, cfg: dict) -> None:
        self.dir = directory
        self.cfg = cfg
        self.state: dict = dict(cfg.get("record") or {})
        self.state.update(phase="starting", monitor_pid=os.getpid(), monitor_start=start_time(os.getpid()))

    def save(self, **kw) -> None:
        self.state.update(kw)
        write_state(self.dir, self.state)

    def report(self, msg: dict) -> None:
        try:
            os.write(1, (_dumps(msg) + "\n").encode())
        except OSError:
            pass  # The agent is gone; the state file says the same.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)

    def fail(self, message: str) -> None:
        self.save(phase="failed", message=message, finished_at=time.time())
        self.report({"error": message})

    def run(self) -> int:
        from gpufleet.agent.runtime.crilog import CRILogWriter

        cfg = self.cfg
        sandboxed = bool(cfg.get("sandboxed"))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        keep: list[int] = []
        argv = list(cfg["argv"])
        status_r = block_w = -1
        if sandboxed:
            status_r, status_w = os.pipe()
            block_r, block_w = os.pipe()
            keep = [status_w, block_r]
            argv = [
                str(status_w) if a == "@STATUS_FD@" else str(block_r) if a == "@BLOCK_FD@" else a for a in argv
            ]
        cgroup_procs = list(cfg.get("cgroup_procs") or [])
        oom_file = cfg.get("oom_file")
        oom_base = _oom_kills(oom_file)
        self.save(oom_base=oom_base)
        try:
            writer = CRILogWriter(cfg["log_path"], time.time)
        except OSError as e:
            self.fail(f"cannot open the container's log {cfg['log_path']}: {e.strerror or e}")
            return 1
        try:
            child = _spawn(
                argv,
                cfg["env"],
                cfg.get("cwd") or "/",
                out_w,
                err_w,
                keep,
                [] if sandboxed else cgroup_procs,
                new_session=not sandboxed,
            )
        except OSError as e:
            writer.close()
            self.fail(f"cannot start {cfg.get('program') or argv[0]}: {e}")
            return 1
        finally:
            for fd in (out_w, err_w, *keep):
                os.close(fd)
        cfg.pop("env", None)
        started_at = time.time()
        main_pid: int | None = child
        sandbox_pid: int | None = child
        early_status: int | None = None
        if sandboxed:
            sandbox_pid, main_pid, early_status, failure = self.enter(child, status_r, block_w, err_r, cgroup_procs)
            if failure:
                writer.close()
                self.fail(failure)
                return 1
        info = {
            "pid": main_pid,
            "pid_start": start_time(main_pid) if main_pid else None,
            "sandbox_pid": sandbox_pid,
            "sandbox_start": start_time(sandbox_pid) if sandbox_pid else None,
            "started_at": started_at,
        }
        if main_pid is not None and info["pid_start"] is None:
            info["pid"] = None
        self.save(phase="running", **info)
        self.report({"ok": True, **info, "monitor_pid": os.getpid(), "monitor_start": self.state["monitor_start"]})

        if early_status is not None:
            status = early_status
        else:
            status = self.pump(child, writer, out_r, err_r, sandboxed, cgroup_procs)
            out_r = err_r = -1
        for fd in (out_r, err_r, status_r):
            if fd >= 0:
                try:
                    if fd != status_r:
                        self.drain(fd, writer, "stdout" if fd == out_r else "stderr")
                    os.close(fd)
                except OSError:
                    pass
        if not sandboxed:
            self.kill_leftovers(child, cgroup_procs)
        code = os.waitstatus_to_exitcode(status)
        sig = 0
        if code < 0:
            sig, code = -code, 128 - code
        elif sandboxed and code > 128:
            # bwrap reports a death by signal N as 128+N, as a shell does.
            sig = code - 128
        self.save(
            phase="exited",
            exit_code=code,
            signal=sig,
            finished_at=time.time(),
            oom=_oom_kills(oom_file) > oom_base,
        )
        return 0

    def enter(self, child: int, status_r: int, block_w: int, err_r: int,
              cgroup_procs: list[str]) -> tuple[int | None, int | None, int | None, str]:
        """Sees the sandbox through its start: (sandbox pid, program pid, bwrap's wait
        status if it is over already, why it failed or "").

        bwrap reports its pid 1 (the sandbox's init) on the status pipe, then waits on the
        block pipe after building the mounts: in between, the sandbox joins its cgroups,
        so everything it forks is accounted there. The program is the child that init
        forks next."""
        line = _read_line(status_r)
        sandbox_pid = _child_pid(line)
        if sandbox_pid is not None:
            try:
                for f in cgroup_procs:
                    with open(f, "w") as cg:
                        cg.write(str(sandbox_pid))
            except OSError as e:
                os.kill(sandbox_pid, signal.SIGKILL)
                os.waitpid(child, 0)
                return None, None, None, f"cannot put the container into its cgroup: {e.strerror or e}"
            try:
                os.write(block_w, b"x")
            except OSError:
                pass  # It died while setting up: found out below.
        os.close(block_w)
        status: int | None = None
        delay = 0.0002
        while sandbox_pid is not None:
            main_pid = _first_child(sandbox_pid)
            if main_pid is not None:
                return sandbox_pid, main_pid, None, ""
            pid, st = os.waitpid(child, os.WNOHANG)
            if pid:
                status = st
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        if status is None:
            _, status = os.waitpid(child, 0)
        # bwrap writes an exit code only for a sandbox it finished setting up (then the
        # program ran, too briefly to be seen); without one, stderr holds its complaint.
        os.set_blocking(status_r, False)
        rest = b""
        try:
            rest = os.read(status_r, 65536)
        except OSError:
            pass
        if b"exit-code" in line + rest:
            return sandbox_pid, None, status, ""
        why = _drain_text(err_r) or f"status {status}"
        return None, None, status, f"cannot set up the container's sandbox: {why}"

    def drain(self, fd: int, writer, stream: str) -> None:
        os.set_blocking(fd, False)
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                writer.feed(stream, data)
        except BlockingIOError:
            pass
        writer.finish(stream)

    def pump(self, child: int, writer, out_r: int, err_r: int, sandboxed: bool, cgroup_procs: list[str]) -> int:
        streams = {out_r: "stdout", err_r: "stderr"}
        poller = select.poll()
        for fd in streams:
            poller.register(fd, select.POLLIN)
        pidfd = -1
        try:
            pidfd = os.pidfd_open(child)
            poller.register(pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pass
        status: int | None = None
        deadline: float | None = None
        while streams or status is None:
            timeout = None if pidfd >= 0 and status is None else 200
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                timeout = min(timeout or 200, left * 1000)
            for fd, _ev in poller.poll(timeout):
                if fd in streams:
                    data = os.read(fd, 65536)
                    if data:
                        writer.feed(streams[fd], data)
                    else:
                        writer.finish(streams.pop(fd))
                        poller.unregister(fd)
                        os.close(fd)
            if status is None:
                pid, st = os.waitpid(child, os.WNOHANG)
                if pid:
                    status = st
                    if pidfd >= 0:
                        poller.unregister(pidfd)
                        os.close(pidfd)
                        pidfd = -1
                    if not sandboxed:
                        # Nothing a container started may outlive it (and hold GPU memory);
                        # a sandbox's PID namespace ends with it by itself.
                        self.kill_leftovers(child, cgroup_procs)
                    deadline = time.monotonic() + _DRAIN_S
        for fd, stream in streams.items():
            writer.finish(stream)
            os.close(fd)
        assert status is not None
        return status

    @staticmethod
    def kill_leftovers(pgid: int, cgroup_procs: list[str]) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        for f in cgroup_procs:
            try:
                with open(f) as cg:
                    pids = [int(x) for x in cg.read().split()]
            except (OSError, ValueError):
                continue
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass


def _drain_text(fd: int) -> str:
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) < 65536:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    lines = [ln.strip() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    directory = argv[1]
    data = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        data += chunk
    cfg = marshal.loads(data)
    if os.fork() > 0:
        # The agent reaps this one at once; the monitor lives on as an orphan.
        os._exit(0)
    os.setsid()
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(os.path.join(directory, "monitor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 2)
    os.close(log)
    m = Monitor(directory, cfg)
    try:
        return m.run()
    except BaseException as e:
        if m.state.get("phase") == "starting":
            m.fail(f"the container's monitor failed: {e}")
        raise


if __name__ == "__main__":
    sys.exit(main())
