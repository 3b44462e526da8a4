"""Pure pieces of the process runtime's sandbox: capabilities, identities, /etc/hosts, the
bwrap command line, and the monitor's JSON writer."""

from __future__ import annotations

import json

import pytest

from gpufleet.agent.runtime.base import HostAlias, Mount, RuntimeError_, SecuritySpec
from gpufleet.agent.runtime.monitor import _child_pid, _dumps
from gpufleet.agent.runtime.sandbox import (
    DEFAULT_CAPABILITIES,
    Passwd,
    Plan,
    RootEntry,
    bwrap_args,
    effective_capabilities,
    hosts_file,
    resolve_identity,
    view_to_node,
    visible_hidden,
)


def test_capabilities_drop_then_add():
    assert set(effective_capabilities(SecuritySpec())) == set(DEFAULT_CAPABILITIES)
    caps = effective_capabilities(SecuritySpec(capabilities_drop=("ALL",), capabilities_add=("net_admin", "CAP_KILL")))
    assert caps == ("CAP_KILL", "CAP_NET_ADMIN")
    assert "CAP_NET_RAW" not in effective_capabilities(SecuritySpec(capabilities_drop=("NET_RAW",)))
    with pytest.raises(RuntimeError_, match="capabilities.drop: unknown capability 'NOPE'"):
        effective_capabilities(SecuritySpec(capabilities_drop=("NOPE",)))


def ident(sec: SecuritySpec, **kw):
    args = dict(default_user=(65534, 65534), agent_uid=0, agent_gid=0, userns_available=True, pod="p", container="c")
    args.update(kw)
    return resolve_identity(sec, **args)


def test_identities():
    assert ident(SecuritySpec()).uid == 65534 and ident(SecuritySpec()).mode == "host"
    # A known user gets its primary group and its groups, then the pod's.
    who = ident(SecuritySpec(run_as_user=1000, supplemental_groups=(7,), fs_group=9),
                lookup={1000: Passwd("alice", 100, "/home/alice", (100, 27))})
    assert (who.uid, who.gid, who.groups, who.home) == (1000, 100, (27, 7, 9), "/home/alice")
    # An unknown uid: the default group, not root's.
    assert ident(SecuritySpec(run_as_user=4242)).gid == 65534
    root = ident(SecuritySpec(run_as_user=0))
    assert (root.mode, root.outer_uid, root.capabilities) == ("userns", 65534, effective_capabilities(SecuritySpec()))
    assert ident(SecuritySpec(privileged=True)).capabilities is None
    with pytest.raises(RuntimeError_, match="needs securityContext.privileged: true"):
        ident(SecuritySpec(run_as_user=0), userns_available=False)
    # An agent that is not root: its own user, whatever was asked.
    assert ident(SecuritySpec(run_as_user=5), agent_uid=1000, agent_gid=1000).uid == 1000


def test_hosts_file():
    text = hosts_file("web-0", "10.0.0.5", [HostAlias("1.2.3.4", ("a", "b"))],
                      "127.0.0.1 localhost\n10.0.0.9 gpu-2 # rack 1\n::1 ip6-localhost\n")
    lines = text.splitlines()
    assert lines[0] == "# Kubernetes-managed hosts file (host network)."
    assert "10.0.0.5\tweb-0" in lines and "10.0.0.9 gpu-2 # rack 1" in lines
    assert lines[-2:] == ["# Entries added by HostAliases.", "1.2.3.4\ta b"]
    assert sum(ln.startswith("127.0.0.1") for ln in lines) == 1


def test_bwrap_order_hides_after_sharing_and_mounts_last():
    plan = Plan(hostname="h", root=[RootEntry("/usr", "dir"), RootEntry("/bin", "symlink", "usr/bin")],
                tmp_dir="/state/c/tmp", hosts_path="/state/hosts", hostname_path="/state/hostname",
                shared=["/scratch"], hidden=[("/scratch/agent", True)], mounts=[Mount("/vol", "/data/in", True)])
    a = bwrap_args("bwrap", plan)
    assert a[a.index("--symlink") + 1:a.index("--symlink") + 3] == ["usr/bin", "/bin"]
    assert a.index("/scratch") < a.index("/scratch/agent") < a.index("/data/in")
    # bwrap would make the missing parent 0700: made first, 0755.
    assert a[a.index("/data") - 3:a.index("/data") + 1] == ["--perms", "0755", "--dir", "/data"]
    assert a[a.index("/vol") - 1] == "--ro-bind" and a[-1] == "--"
    assert "--setenv" not in a


def test_where_a_container_path_lives_on_the_node():
    mounts = [Mount("/vols/a", "/data")]
    kw = dict(mounts=mounts, shared=["/scratch"], hidden=["/scratch/agent"], tmp_dir="/c/tmp")
    assert view_to_node("/data/x", **kw) == "/vols/a/x"
    assert view_to_node("/tmp/y", **kw) == "/c/tmp/y"
    assert view_to_node("/scratch/agent/key", **kw) is None
    assert view_to_node("/usr/bin/sh", **kw) == "/usr/bin/sh"
    assert visible_hidden(["/tmp/state", "/var/lib/agent", "/scratch/s"], ["/scratch"]) == ["/var/lib/agent", "/scratch/s"]


def test_monitor_json_is_json():
    state = {"a": "quote \" backslash \\ newline \n tab \t bell \x07 é", "n": [1, 2.5, None, True, False], "d": {"k": -3}}
    assert json.loads(_dumps(state)) == state
    assert _child_pid(b'{ "child-pid": 1234, "cgroup-namespace": 4026531835 }\n') == 1234
    assert _child_pid(b"") is None
