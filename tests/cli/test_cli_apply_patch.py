import json

from gpufleet.cli.commands.apply import last_applied, three_way_merge_patch, with_last_applied
from gpufleet.cli.output import LAST_APPLIED


def _deploy(replicas=2, image="img:1", labels=None):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": labels or {"app": "web"}},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": image}]}}},
    }


def _live(manifest):
    """What the server would store: the applied manifest plus defaults and status."""
    live = json.loads(json.dumps(manifest))
    live["metadata"].update(uid="u1", resourceVersion="7", generation=1)
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    live["status"] = {"replicas": 2}
    return live


def test_annotation_records_manifest_without_itself():
    modified = with_last_applied(_deploy())
    recorded = json.loads(modified["metadata"]["annotations"][LAST_APPLIED])
    assert recorded == _deploy()
    assert last_applied(modified) == _deploy()
    # applying the output again records the same thing (no annotation inside the annotation)
    assert with_last_applied(modified) == modified


def test_unchanged_manifest_gives_empty_patch_despite_defaults():
    modified = with_last_applied(_deploy())
    live = _live(modified)
    assert three_way_merge_patch(last_applied(live), with_last_applied(_deploy()), live) == {}


def test_changed_field_and_removed_label():
    first = with_last_applied(_deploy(labels={"app": "web", "tier": "fe"}))
    live = _live(first)
    live["metadata"]["labels"]["added-by-someone"] = "x"
    second = with_last_applied(_deploy(replicas=3, labels={"app": "web"}))
    patch = three_way_merge_patch(last_applied(live), second, live)
    assert patch["spec"] == {"replicas": 3}
    assert patch["metadata"]["labels"] == {"tier": None}
    assert LAST_APPLIED in patch["metadata"]["annotations"]


def test_changed_list_is_replaced_whole():
    live = _live(with_last_applied(_deploy()))
    patch = three_way_merge_patch(last_applied(live), with_last_applied(_deploy(image="img:2")), live)
    assert patch["spec"]["template"]["spec"]["containers"] == [{"name": "c", "image": "img:2"}]


def test_list_changed_by_someone_else_is_restored():
    live = _live(with_last_applied(_deploy()))
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "hotfix"
    patch = three_way_merge_patch(last_applied(live), with_last_applied(_deploy()), live)
    assert patch["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"


def test_field_dropped_from_manifest_is_deleted_but_others_fields_stay():
    manifest = _deploy()
    live = _live(with_last_applied(manifest))
    without_replicas = _deploy()
    del without_replicas["spec"]["replicas"]
    patch = three_way_merge_patch(last_applied(live), with_last_applied(without_replicas), live)
    assert patch["spec"] == {"replicas": None}
    assert "strategy" not in patch["spec"]


def test_no_annotation_means_no_deletions():
    live = _live(_deploy(labels={"app": "web", "tier": "fe"}))
    patch = three_way_merge_patch(None, with_last_applied(_deploy(labels={"app": "web"})), live)
    assert "labels" not in patch["metadata"]
