"""Isolation on a real node, as a team's `edit` token sees it, on both runtimes that run real
programs: podman containers, and the sandboxed process runtime (bare metal).

- Pod Security refuses hostPath, privileged and hostPID pods with Kubernetes' message.
- A pod cannot read the control plane's state dir (the admin token, the CA key), another
  pod's files or its environment (a Secret), and sees only its own processes.
- The pod contract of test_pod_contract.py's volume test holds on the process runtime too:
  ConfigMap, Secret and downward API files, a shared emptyDir, a local-path claim kept across
  the pod being recreated, and the runAsUser.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from test_pod_contract import (
    BUSYBOX,
    Plane,
    make_sources,
    namespace,
    reader_says,
    running_plane,
    volume_pod,
    wait_until,
)

from gpufleet.client.api import Client
from gpufleet.client.errors import Forbidden
from gpufleet.client.kubeconfig import transport_from_kubeconfig

pytestmark = pytest.mark.e2e

SECRET = "team-b-password-4711"


@pytest.fixture(scope="module", params=["podman", "process"])
def plane(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp(f"isolation-{request.param}"), "--runtime", request.param) as p:
        p.runtime = request.param  # type: ignore[attr-defined]
        yield p


def team_client(plane: Plane, ns: str, user: str) -> Client:
    path = plane.state.parent / f"{user}.kubeconfig"
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "token", "create", "--namespace", ns,
                          "--role", "edit", "--user", user, "--write-kubeconfig", str(path),
                          "--kubeconfig", str(plane.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return Client(transport_from_kubeconfig(str(path)))


def pod(name: str, ns: str, script: str, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"terminationGracePeriodSeconds": 1, **spec, "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script]}]}}


async def logs_when(plane: Plane, ns: str, name: str, marker: str = "done") -> str:
    async def said():
        out = await asyncio.to_thread(plane.kubectl, "logs", name, "-n", ns)
        return out.stdout if marker in out.stdout else None

    return await wait_until(said, 90, f"{ns}/{name} to report", plane)


async def test_a_teams_edit_token_cannot_reach_the_host_or_another_team(plane: Plane):
    admin = plane.client()
    try:
        a = await namespace(admin, f"team-a-{plane.runtime}")
        b = await namespace(admin, f"team-b-{plane.runtime}")
        alice = team_client(plane, a, "alice")
        bob = team_client(plane, b, "bob")
        try:
            # 1. Pod Security: the team cannot even ask for the host.
            for name, spec, words in (
                ("hostpath", {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, 'hostPath volumes (volume "h")'),
                ("hostpid", {"hostPID": True}, "host namespaces (hostPID=true)"),
            ):
                with pytest.raises(Forbidden) as e:
                    await alice.create(pod(name, a, "true", **spec), a, raw=True)
                assert f'violates PodSecurity "baseline:latest": {words}' in str(e.value), e.value
            privileged = pod("priv", a, "true")
            privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
            with pytest.raises(Forbidden) as e:
                await alice.create(privileged, a, raw=True)
            assert 'privileged (container "main" must not set securityContext.privileged=true)' in str(e.value)

            # 2. Team b's pod holds a Secret in its environment and a file of its own.
            await bob.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": b},
                              "stringData": {"password": SECRET}}, b, raw=True)
            victim = pod("victim", b, "echo private > /tmp/mine; echo started; sleep 3600")
            victim["spec"]["containers"][0]["env"] = [
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]
            await bob.create(victim, b, raw=True)
            await logs_when(plane, b, "victim", "started")

            # 3. Team a's pod looks for all of it.
            state = plane.state
            probe = (f"cat {state}/tokens.csv 2>/dev/null | head -c 200 | sed 's/^/TOKENS:/'; "
                     f"cat {state}/pki/ca.key 2>/dev/null | head -c 100 | sed 's/^/CAKEY:/'; "
                     f"ls {state} 2>/dev/null | sed 's/^/STATE:/'; "
                     "for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $e 2>/dev/null; done | "
                     "grep PASSWORD | sed 's/^/ENV:/'; "
                     "cat /tmp/mine 2>/dev/null | sed 's/^/FILE:/'; "
                     "echo procs=$(ls -d /proc/[0-9]* | wc -l); echo done")
            await alice.create(pod("snoop", a, probe, restartPolicy="Never"), a, raw=True)
            out = await logs_when(plane, a, "snoop")
            assert "TOKENS:" not in out and "CAKEY:" not in out and "STATE:" not in out, out
            assert SECRET not in out and "ENV:" not in out and "FILE:" not in out, out
            # Its own shell, its pipeline and the container's init: nothing of other pods or the host.
            procs = int(next(line for line in out.splitlines() if line.startswith("procs=")).split("=")[1])
            assert procs < 10, out
        finally:
            await alice.close()
            await bob.close()
    finally:
        await admin.close()


def test_the_state_dir_is_not_readable_by_other_local_users(plane: Plane):
    # Modes, and a real read attempt as nobody.
    for path in (plane.state, plane.state / "tokens.csv", plane.state / "pki" / "ca.key", plane.state / "state.db"):
        mode = path.stat().st_mode & 0o777
        assert mode & 0o077 == 0, (path, oct(mode))
    read = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat",
                           str(plane.state / "tokens.csv")], capture_output=True, text=True, check=False)
    assert read.returncode != 0 and "Permission denied" in read.stderr, read


async def test_volumes_and_the_user_on_this_runtime(plane: Plane):
    client = plane.client()
    try:
        ns = await namespace(client, f"vols-{plane.runtime}")
        await make_sources(client, ns)
        await client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "data", "namespace": ns},
                             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
                            ns, raw=True)
        await client.create(volume_pod(ns, "keeper", BUSYBOX, claim="data"), ns, raw=True)
        first = await reader_says(plane, client, ns, "keeper")
        assert "cfg=hello-config sec=s3cr3t name=keeper shared=written-by-1234 uid=1234 gid=1234" in first, first
        assert "kept=none" in first, first
        await client.delete("Pod", "keeper", ns, grace_period_seconds=1)

        async def gone():
            pods = await client.list("Pod", ns, raw=True)
            return not [p for p in pods if p["metadata"]["name"] == "keeper"]

        await wait_until(gone, 60, "the first pod gone", plane)
        await client.create(volume_pod(ns, "keeper", BUSYBOX, claim="data"), ns, raw=True)
        assert "kept=keeper" in await reader_says(plane, client, ns, "keeper")
        if plane.runtime == "process":  # type: ignore[attr-defined]
            pods = await client.list("Pod", ns, raw=True)
            conds = {c["type"]: c for c in list(pods)[0]["status"]["conditions"]}
            # The image is the host's programs here, and the pod is told so.
            assert "not used" in conds["gpufleet.io/RuntimeLimitation"]["message"], json.dumps(conds)
    finally:
        await client.close()



