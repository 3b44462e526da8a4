"""kubectl against a secured `gpufleet up`: TLS with the generated CA, the admin token of the
generated kubeconfig, team tokens from `gpufleet token create`, and RBAC answers kubectl
prints as it would against a real cluster."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_helpers import Cluster, Kubectl

from gpufleet.agent.bootstrap import request_node_token
from gpufleet.client import Client, HttpTransport

pytestmark = pytest.mark.e2e


def gpufleet(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", *args, "--kubeconfig", cluster.kubeconfig],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"gpufleet {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def as_user(kubectl: Kubectl, kubeconfig: Path) -> Kubectl:
    return Kubectl(kubectl.binary, str(kubeconfig), tempfile.mkdtemp(prefix="kubectl-home-"))


def test_generated_kubeconfig_speaks_tls_with_an_admin_token(cluster: Cluster, kubectl: Kubectl) -> None:
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    entry = doc["clusters"][0]["cluster"]
    assert entry["server"].startswith("https://127.0.0.1:") and "insecure-skip-tls-verify" not in entry
    assert entry["certificate-authority-data"] and doc["users"][0]["user"]["token"]
    assert "No resources found in default namespace." in kubectl("get", "pods").ok().stderr
    assert kubectl("auth", "can-i", "create", "pods").ok().stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "delete", "nodes").ok().stdout.strip() == "yes"
    who = kubectl("auth", "whoami", "-o", "json").ok()
    assert yaml.safe_load(who.stdout)["status"]["userInfo"] == {
        "username": "admin", "groups": ["system:masters", "system:authenticated"]}


def test_team_token_is_confined_to_its_namespace(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    for ns in ("team-a", "team-b"):
        kubectl("create", "namespace", ns).ok()
    kubeconfig = tmp_path / "alice.kubeconfig"
    gpufleet(cluster, "token", "create", "--namespace", "team-a", "--role", "edit", "--user", "alice",
             "--write-kubeconfig", str(kubeconfig))
    alice = as_user(kubectl, kubeconfig)
    # Its own namespace (the kubeconfig's default): everything edit allows.
    assert "No resources found in team-a namespace." in alice("get", "pods").ok().stderr
    assert alice("create", "configmap", "settings", "--from-literal=k=v").ok().stdout.strip() == \
        "configmap/settings created"
    assert alice("auth", "can-i", "create", "deployments").ok().stdout.strip() == "yes"
    # Anywhere else: Kubernetes' Forbidden, word for word.
    denied = alice("get", "pods", "-n", "team-b").failed()
    assert denied.stderr.strip() == ('Error from server (Forbidden): pods is forbidden: User "alice" cannot list '
                                     'resource "pods" in API group "" in the namespace "team-b"')
    denied = alice("delete", "configmap", "x", "-n", "team-b").failed()
    assert 'configmaps "x" is forbidden: User "alice" cannot delete resource "configmaps"' in denied.stderr
    no = alice("auth", "can-i", "list", "pods", "-n", "team-b")
    assert (no.returncode, no.stdout.strip()) == (1, "no")
    assert alice("auth", "can-i", "list", "nodes").stdout.strip() == "no"
    assert "alice" in alice("auth", "whoami").ok().stdout
    rules = {line.split()[0]: line for line in alice("auth", "can-i", "--list").ok().stdout.splitlines()[1:]}
    assert "create" in rules["deployments.apps"] and "delete" in rules["configmaps"]
    assert "resourcequotas" in rules and "create" not in rules["resourcequotas"]
    assert "nodes" not in rules
    assert "configmaps" not in alice("auth", "can-i", "--list", "-n", "team-b").ok().stdout


def test_requests_without_a_valid_token_are_turned_away(cluster: Cluster, kubectl: Kubectl,
                                                        tmp_path: Path) -> None:
    made = gpufleet(cluster, "token", "create", "--namespace", "default", "--role", "view", "-o", "json")
    token = yaml.safe_load(made.stdout)
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["users"][0]["user"] = {"token": token["token"]}
    revoked = tmp_path / "revoked.kubeconfig"
    revoked.write_text(yaml.safe_dump(doc))
    assert "No resources found" in as_user(kubectl, revoked)("get", "pods").ok().stderr
    gpufleet(cluster, "token", "delete", token["id"])
    doc["users"][0]["user"] = {"token": token["token"][:-1] + "x"}
    forged = tmp_path / "forged.kubeconfig"
    forged.write_text(yaml.safe_dump(doc))
    for path in (forged, revoked):
        result = as_user(kubectl, path)("get", "pods").failed()
        assert "You must be logged in to the server" in result.stderr, result


def node_kubeconfig(cluster: Cluster, node: str, path: Path) -> Path:
    """A kubeconfig for ``system:node:<node>``, whose token is bought with the join token as
    an agent buys it."""
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ca = base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"])
    join = (cluster.state_dir / "join-token").read_text().strip()

    async def join_as_node() -> str:
        async with Client(HttpTransport(cluster.url, token=join, ca_data=ca)) as client:
            return await request_node_token(client, node)

    doc["users"][0]["user"] = {"token": asyncio.run(join_as_node())}
    path.write_text(yaml.safe_dump(doc))
    return path


POD_USING_MINE = """
apiVersion: v1
kind: Node
metadata: {name: e2e-node}
---
apiVersion: v1
kind: Pod
metadata: {name: uses-mine, namespace: default}
spec:
  nodeName: e2e-node
  containers:
  - name: c
    image: python:3.12
    env:
    - name: TOKEN
      valueFrom: {secretKeyRef: {name: mine, key: token}}
"""


def test_a_node_reads_only_the_secrets_of_its_own_pods(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    for name in ("mine", "other"):
        kubectl("create", "secret", "generic", name, "--from-literal=token=s3cr3t").ok()
    kubectl("apply", "-f", "-", input=POD_USING_MINE).ok()
    node = as_user(kubectl, node_kubeconfig(cluster, "e2e-node", tmp_path / "node.kubeconfig"))
    assert node("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").ok().stdout == \
        "system:node:e2e-node"
    token = node("get", "secret", "mine", "-o", "jsonpath={.data.token}").ok().stdout
    assert base64.b64decode(token) == b"s3cr3t"
    assert node("auth", "can-i", "get", "secret/mine").ok().stdout.strip() == "yes"
    # Kubernetes' Node authorizer, word for word.
    denied = node("get", "secret", "other").failed()
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): secrets "other" is forbidden: User "system:node:e2e-node" cannot get '
        'resource "secrets" in API group "" in the namespace "default": '
        "no relationship found between node 'e2e-node' and this object")
    denied = node("get", "secrets").failed()
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): secrets is forbidden: User "system:node:e2e-node" cannot list '
        'resource "secrets" in API group "" in the namespace "default": '
        "can only get individual resources of this type")
    no = node("auth", "can-i", "list", "secrets")
    assert (no.returncode, no.stdout.strip()) == (1, "no - can only get individual resources of this type")
    # What it reads broadly, as a kubelet does.
    node("get", "services").ok()
    kubectl("delete", "pod", "uses-mine", "--grace-period=0", "--force").ok()
    assert "Forbidden" in node("get", "secret", "mine").failed().stderr


def test_a_node_lists_only_its_own_pods(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    node = as_user(kubectl, node_kubeconfig(cluster, "e2e-lister", tmp_path / "lister.kubeconfig"))
    denied = node("get", "pods", "-A").failed()
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): pods is forbidden: User "system:node:e2e-lister" cannot list resource '
        '"pods" in API group "" at the cluster scope: can only list/watch pods with spec.nodeName field selector')
    assert "Forbidden" in node("get", "pods", "-A", "--field-selector", "spec.nodeName=e2e-node").failed().stderr
    mine = node("get", "pods", "-A", "--field-selector", "spec.nodeName=e2e-lister").ok()
    assert "No resources found" in mine.stderr
    no = node("auth", "can-i", "list", "pods")
    assert (no.returncode, no.stdout.strip()) == (
        1, "no - can only list/watch pods with spec.nodeName field selector")


POD_ON_AGENT = """
apiVersion: v1
kind: Pod
metadata: {name: chatty, namespace: default}
spec:
  nodeName: e2e-agent
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: python:3.12
    command: [__PYTHON__, -u, -c, "print('hello from e2e-agent'); import time; time.sleep(120)"]
"""


def test_agent_endpoints_only_through_the_api(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    """A joined agent answers its stats, metrics and logs only to the API server: kubectl
    logs / top and `get --raw .../nodes/<name>/proxy/...` work; the agent's port, asked
    directly, answers 401 to anyone but /healthz."""
    state = tmp_path / "agent"
    agent_log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli.main", "agent", "--server", cluster.url,
         "--token-file", str(cluster.state_dir / "join-token"),
         "--certificate-authority", str(cluster.state_dir / "pki" / "ca.crt"), "--name", "e2e-agent",
         "--gpus", "1", "--state-dir", str(state), "--cpus", "2", "--memory", "4Gi",
         "--taints", "e2e=agent:NoSchedule", "--runtime", "process"],
        stdout=subprocess.DEVNULL, stderr=agent_log, text=True, start_new_session=True)

    def until(what: str, check, limit: float = 40.0):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(0.5)
        pytest.fail(f"timed out waiting for {what}\n{(tmp_path / 'agent.log').read_text()[-3000:]}",
                    pytrace=False)

    try:
        until("the agent's node to be Ready", lambda: kubectl(
            "get", "node", "e2e-agent", "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
            .stdout == "True")
        kubectl("apply", "-f", "-", input=POD_ON_AGENT.replace("__PYTHON__", sys.executable)).ok()
        logs = until("kubectl logs", lambda: (r := kubectl("logs", "chatty")).returncode == 0
                     and "hello from e2e-agent" in r.stdout and r)
        assert logs.stdout == "hello from e2e-agent\n"
        top_nodes = until("kubectl top node", lambda: (r := kubectl("top", "node", "e2e-agent")).returncode == 0
                          and r)
        assert top_nodes.stdout.split()[:5] == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
        assert top_nodes.stdout.splitlines()[1].split()[0] == "e2e-agent"
        top_pods = until("kubectl top pod", lambda: (r := kubectl("top", "pod", "chatty")).returncode == 0 and r)
        assert top_pods.stdout.splitlines()[1].split()[0] == "chatty"
        metrics = kubectl("get", "--raw", "/api/v1/nodes/e2e-agent/proxy/metrics").ok().stdout
        assert "gpufleet_node_cpu_usage_cores" in metrics
        summary = json.loads(kubectl("get", "--raw", "/api/v1/nodes/e2e-agent/proxy/stats/summary").ok().stdout)
        assert summary["node"]["nodeName"] == "e2e-agent"

        # The agent's own port, straight: TLS only, and 401 but for /healthz.
        node = json.loads(kubectl("get", "node", "e2e-agent", "-o", "json").ok().stdout)
        port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        base = f"https://127.0.0.1:{port}"
        unverified = ssl._create_unverified_context()
        with urllib.request.urlopen(f"{base}/healthz", timeout=5, context=unverified) as resp:
            assert resp.read() == b"ok"
        for path in ("/stats/summary", "/stats/workload", "/metrics", "/containerLogs/default/chatty/main"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(
                    f"{base}{path}", headers={"Authorization": f"Bearer {cluster.token}"}), timeout=5,
                    context=unverified)
            assert refused.value.code == 401, path
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/stats/summary", timeout=5)
        # A user without nodes/proxy (a team's edit token) is refused by the API server.
        gpufleet(cluster, "token", "create", "--namespace", "default", "--role", "edit", "--user", "carol",
                 "--write-kubeconfig", str(tmp_path / "carol.kubeconfig"))
        carol = as_user(kubectl, tmp_path / "carol.kubeconfig")
        denied = carol("get", "--raw", "/api/v1/nodes/e2e-agent/proxy/metrics").failed()
        assert 'cannot get resource "nodes/proxy"' in denied.stderr, denied
    finally:
        kubectl("delete", "pod", "chatty", "--grace-period=0", "--force")
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        agent_log.close()


IMPERSONATION_NODES = """
apiVersion: v1
kind: Node
metadata: {name: as-n1}
---
apiVersion: v1
kind: Node
metadata: {name: as-n2}
"""


def test_kubectl_as_acts_as_another_user(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    for ns in ("as-team-a", "as-team-b"):
        kubectl("create", "namespace", ns).ok()
    kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice", "-n", "as-team-a").ok()
    # The admin asks as alice and gets alice's answers.
    no = kubectl("auth", "can-i", "list", "pods", "-n", "as-team-b", "--as", "alice")
    assert (no.returncode, no.stdout) == (1, "no\n")
    assert kubectl("auth", "can-i", "list", "pods", "-n", "as-team-a", "--as", "alice").ok().stdout == "yes\n"
    denied = kubectl("get", "pods", "-n", "as-team-b", "--as", "alice").failed()
    assert denied.stderr == ('Error from server (Forbidden): pods is forbidden: User "alice" cannot list resource '
                             '"pods" in API group "" in the namespace "as-team-b"\n')
    who = json.loads(kubectl("auth", "whoami", "--as", "alice", "--as-group", "ml", "-o", "json").ok().stdout)
    assert who["status"]["userInfo"] == {"username": "alice", "groups": ["ml", "system:authenticated"]}
    # kubectl itself refuses groups without a user.
    alone = kubectl("get", "pods", "--as-group", "ml").failed()
    assert "without impersonating a user" in alone.stderr
    # A team's token may not impersonate anyone.
    gpufleet(cluster, "token", "create", "--namespace", "as-team-a", "--role", "edit", "--user", "bob",
             "--write-kubeconfig", str(tmp_path / "bob.kubeconfig"))
    bob = as_user(kubectl, tmp_path / "bob.kubeconfig")
    refusal = ('Error from server (Forbidden): users "alice" is forbidden: User "bob" cannot impersonate resource '
               '"users" in API group "" at the cluster scope\n')
    # (kubectl's discovery meets the same 403 first and logs it as "unknown" before the answer.)
    assert bob("auth", "can-i", "list", "pods", "--as", "alice").failed().stderr.endswith(refusal)
    assert bob("get", "--raw", "/api/v1/namespaces/as-team-a/pods", "--as", "alice").failed().stderr == refusal
    assert "Forbidden" in bob("get", "pods", "--as", "alice").failed().stderr
    # Acting as a node: NodeRestriction holds it to its own Node.
    kubectl("apply", "-f", "-", input=IMPERSONATION_NODES).ok()
    try:
        as_node = ("--as", "system:node:as-n1", "--as-group", "system:nodes")
        assert kubectl("label", "node", "as-n1", "seen=yes", *as_node).ok().stdout == "node/as-n1 labeled\n"
        denied = kubectl("label", "node", "as-n2", "seen=yes", *as_node).failed()
        assert denied.stderr == ('Error from server (Forbidden): nodes "as-n2" is forbidden: node "as-n1" is not '
                                 'allowed to modify node "as-n2"\n')
    finally:
        kubectl("delete", "node", "as-n1", "as-n2")


PRIVILEGED_POD = """
apiVersion: v1
kind: Pod
metadata: {name: escape}
spec:
  hostPID: true
  containers:
  - name: shell
    image: busybox
    securityContext: {privileged: true}
  volumes:
  - name: root
    hostPath: {path: /}
"""

PINNED_POD = """
apiVersion: v1
kind: Pod
metadata: {name: pinned}
spec:
  nodeName: some-node
  containers:
  - {name: c, image: busybox}
"""


def test_pod_security_as_kubectl_shows_it(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    """A team's edit token meets Pod Security (baseline by default) and the nodeName rule;
    a namespace the admin labels warn-only answers kubectl's `Warning:` lines."""
    kubectl("create", "namespace", "team-ps").ok()
    kubeconfig = tmp_path / "bob.kubeconfig"
    gpufleet(cluster, "token", "create", "--namespace", "team-ps", "--role", "edit", "--user", "bob",
             "--write-kubeconfig", str(kubeconfig))
    bob = as_user(kubectl, kubeconfig)
    denied = bob("apply", "-f", "-", input=PRIVILEGED_POD).failed()
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "escape" is forbidden: violates '
        'PodSecurity "baseline:latest": host namespaces (hostPID=true), hostPath volumes (volume "root"), '
        'privileged (container "shell" must not set securityContext.privileged=true)')
    assert bob("run", "fine", "--image=busybox", "--restart=Never").ok().stdout.strip() == "pod/fine created"

    denied = bob("apply", "-f", "-", input=PINNED_POD).failed()
    assert denied.stderr.startswith('Error from server (Forbidden): error when creating "STDIN": pods "pinned" is '
                                    'forbidden: spec.nodeName is set to "some-node", which skips the scheduler')
    assert "leave spec.nodeName empty" in denied.stderr
    assert kubectl("apply", "-n", "team-ps", "-f", "-", input=PINNED_POD).ok().stdout.strip() == "pod/pinned created"

    kubectl("label", "namespace", "team-ps", "pod-security.kubernetes.io/enforce=privileged",
            "pod-security.kubernetes.io/warn=restricted").ok()
    made = bob("apply", "-f", "-", input=PRIVILEGED_POD).ok()
    assert made.stdout.strip() == "pod/escape created"
    warning = [line for line in made.stderr.splitlines() if line.startswith("Warning:")]
    assert warning == [
        'Warning: would violate PodSecurity "restricted:latest": host namespaces (hostPID=true), privileged '
        '(container "shell" must not set securityContext.privileged=true), allowPrivilegeEscalation != false '
        '(container "shell" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "shell" must set securityContext.capabilities.drop=["ALL"]), restricted volume types (volume '
        '"root" uses restricted volume type "hostPath"), runAsNonRoot != true (pod or container "shell" must set '
        'securityContext.runAsNonRoot=true), seccompProfile (pod or container "shell" must set '
        'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")']
    # Back to baseline: kubectl shows which existing pods the stricter level would refuse.
    relabeled = kubectl("label", "--overwrite", "namespace", "team-ps",
                        "pod-security.kubernetes.io/enforce=baseline").ok()
    assert 'Warning: existing pods in namespace "team-ps" violate the new PodSecurity enforce level ' \
           '"baseline:latest"' in relabeled.stderr
    assert "Warning: escape: host namespaces, hostPath volumes, privileged" in relabeled.stderr
    bad = kubectl("label", "--overwrite", "namespace", "team-ps", "pod-security.kubernetes.io/enforce=strict").failed()
    assert 'metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of ' \
           "privileged, baseline, restricted" in bad.stderr
