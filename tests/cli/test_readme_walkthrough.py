"""What README.md tells a new user to run, run the same way: the `gpufleet` commands (through
the CLI's own entry point) against a real control plane (controllers, scheduler, Kueue-style
admission, HTTPS with the admin kubeconfig) and a node agent with 4 declared H100s, as
`gpufleet up --gpus 4 --gpu-model H100-SXM-80GB` makes; plus the command-line errors a new
user meets first."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gpufleet.agent.agent import AgentConfig, NodeAgent
from gpufleet.agent.devices import DeclaredDevices
from gpufleet.agent.runtime.simulated import SimulatedRuntime
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ROOT / "examples" / "queues"


class Cli:
    def __init__(self, kubeconfig: Path) -> None:
        self.env = {"KUBECONFIG": str(kubeconfig)}
        self.runner = CliRunner()

    async def __call__(self, *args: str, ok: bool = True) -> Result:
        # The commands run their own event loop, so they run beside this one.
        result = await asyncio.to_thread(self.runner.invoke, app, list(args), env=self.env)
        if ok:
            assert result.exit_code == 0, f"gpufleet {' '.join(args)}: {result.output}"
        return result


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, Cli]]:
    cp = ControlPlane(store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=tmp_path / "state")
    await cp.start()
    agent = NodeAgent(cp.client, SimulatedRuntime(), DeclaredDevices(4, "H100-SXM-80GB", 81920, node_name="vm"),
                      AgentConfig(node_name="vm", state_dir=tmp_path / "agent", heartbeat_interval=0.5,
                                  cpus=16, memory_bytes=64 << 30))
    await agent.start()
    try:
        assert await agent.wait_registered(10), "the agent did not register"
        yield cp, Cli(tmp_path / "state" / "kubeconfig")
    finally:
        with contextlib.suppress(Exception):
            await agent.stop()
        await cp.stop()


async def eventually(fetch: Callable[[], Any], check: Callable[[Any], bool], within: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await fetch()
        if check(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {within}s; last value: {value}")
        await asyncio.sleep(0.2)


def _rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines()[1:] if line.strip()]


async def test_team_queues_example_borrows_then_the_lender_reclaims(cluster) -> None:
    """README "Team queues" with examples/queues: team A's second Job borrows team B's idle
    quota; team B's PyTorchJob takes it back, and the borrowed Job waits with the reason."""
    cp, cli = cluster
    await cli("apply", "-f", str(QUEUES / "teams.yaml"))
    out = (await cli("get", "queues", "-A")).output
    assert {(r[0], r[1], r[2]) for r in _rows(out)} == {("team-a", "gpus", "team-a"), ("team-b", "gpus", "team-b")}
    out = (await cli("get", "cq")).output
    assert [(r[0], r[1]) for r in _rows(out)] == [("team-a", "lab"), ("team-b", "lab")]

    await cli("apply", "-f", str(QUEUES / "team-a-jobs.yaml"))

    async def running(ns: str) -> dict[str, int]:
        pods = await cp.client.list("pods", ns, raw=True)
        counts: dict[str, int] = {}
        for p in pods:
            if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running":
                owner = (p["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
                counts[owner] = counts.get(owner, 0) + 1
        return counts

    await eventually(lambda: running("team-a"), lambda c: c == {"sweep-1": 2, "sweep-2": 2})
    out = (await cli("get", "cq")).output
    assert [r[:4] for r in _rows(out)][0] == ["team-a", "lab", "0", "2"]

    await cli("apply", "-f", str(QUEUES / "team-b-job.yaml"))
    await eventually(lambda: running("team-b"), lambda c: c == {"finetune": 2})
    counts = await eventually(lambda: running("team-a"), lambda c: sum(c.values()) == 2)
    assert len(counts) == 1, f"one of team A's Jobs keeps running, the other is preempted whole: {counts}"
    preempted = "sweep-2" if "sweep-1" in counts else "sweep-1"

    out = (await cli("get", "queues", "-A")).output
    assert ["team-a", "gpus", "team-a", "1", "1", "Quota=1"] == _rows(out)[0][:6], out
    out = (await cli("get", "workloads", "-n", "team-a", "-o", "wide")).output
    waiting = [line for line in out.splitlines() if f"job-{preempted}-" in line]
    assert waiting and "Quota" in waiting[0] and "insufficient unused quota" in waiting[0], out
    name = waiting[0].split()[0]
    out = (await cli("describe", "workload", "-n", "team-a", name)).output
    assert "due to reclamation within the cohort" in out, out
    assert "team-b/pytorchjob-finetune-" in out, out


async def test_token_create_in_a_missing_namespace_names_the_fix(cluster) -> None:
    _, cli = cluster
    result = await cli("token", "create", "--namespace", "team-z", "--role", "edit", "--user", "bob", ok=False)
    assert result.exit_code == 1
    assert 'namespace "team-z" does not exist' in result.output
    assert "kubectl create namespace team-z" in result.output


@pytest.mark.parametrize("command", ["up", "server"])
def test_a_taken_api_port_is_refused_with_the_flag_to_change(command: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, [command, "--port", str(port), "--state-dir", str(tmp_path)],
                                    env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port} is already in use" in result.output
    assert "--port" in result.output and "0 picks a free one" in result.output
    assert not (tmp_path / "state.db").exists(), "nothing starts before the port is known to be free"


def test_agents_get_a_state_dir_of_their_own_per_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two agents on one machine (or one beside `gpufleet up`) must not share the dir that
    holds a node's token, or one would run under the other's identity."""
    from gpufleet.cli.commands import agent as agent_command

    seen: list[Path] = []

    async def fake_run(config, *args: Any, **kwargs: Any) -> int:
        seen.append(config.state_dir)
        return 0
    monkeypatch.setattr(agent_command, "_run", fake_run)
    for name in ("gpu-7", "sim-1"):
        result = CliRunner().invoke(app, ["agent", "--server", "https://127.0.0.1:1", "--name", name,
                                          "--runtime", "simulated", "--gpus", "8"], env={"HOME": str(tmp_path)})
        assert result.exit_code == 0, result.output
    assert seen == [tmp_path / ".gpufleet" / "agents" / "gpu-7", tmp_path / ".gpufleet" / "agents" / "sim-1"]


def test_server_creates_the_sqlite_directory_or_says_which_flag_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    result = CliRunner().invoke(app, ["server", "--store", f"sqlite://{tmp_path}/a-file/db/state.db", "--port", "0",
                                      "--state-dir", str(tmp_path / "state")], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "--store" in result.output and f"cannot create {tmp_path}/a-file/db" in result.output


async def test_a_gateway_that_cannot_listen_leaves_no_address_behind(tmp_path: Path) -> None:
    """<state-dir>/gateway-url from an earlier run must not outlive a run whose gateway did
    not start: it would send users to whatever now holds that port, or to nothing."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "gateway-url").write_text("http://127.0.0.1:8080\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cp = ControlPlane(store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=state, secure=False,
                          run_controllers=False, gateway_port=taken.getsockname()[1])
        await cp.start()
        try:
            assert cp.gateway is None
            assert not (state / "gateway-url").exists()
        finally:
            await cp.stop()
    cp = ControlPlane(store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=state, secure=False,
                      run_controllers=False, gateway_port=0)
    await cp.start()
    try:
        assert (state / "gateway-url").read_text() == cp.gateway.url + "\n"
    finally:
        await cp.stop()


def test_up_says_it_leads_at_once_and_where_the_election_flags_are() -> None:
    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "it leads at once" in text and "Leases" in text
    assert "run `gpufleet server` (--leader-elect and its timings)" in text
