from gpufleet.cli.describe_text import Doc, format_quantity, parse_quantity, selector_text, smart_label
from gpufleet.cli.output import (
    TablePrinter,
    TableView,
    api_error_message,
    format_table,
    human_duration,
    parse_duration,
    problem_text,
)
from gpufleet.client.errors import error_from_status

COLUMNS = [
    {"name": "Name", "type": "string", "format": "name", "priority": 0},
    {"name": "Ready", "type": "string", "format": "", "priority": 0},
    {"name": "Restarts", "type": "integer", "format": "", "priority": 0},
    {"name": "IP", "type": "string", "format": "", "priority": 1},
]


def _table(*rows):
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "42"},
        "columnDefinitions": COLUMNS,
        "rows": [{"cells": cells, "object": {"metadata": {"name": cells[0], "namespace": ns, "labels": labels}}}
                 for cells, ns, labels in rows],
    }


TABLE = _table((["web-0", "1/1", 0, "10.0.0.5"], "default", {"app": "web", "tier": "fe"}),
               (["train-master-0", "0/1", 3, None], "team-a", {}))


def test_plain_table_hides_wide_columns_and_aligns():
    view = TableView.from_response(TABLE)
    assert view.resource_version == "42"
    assert TablePrinter().lines(view) == [
        "NAME             READY   RESTARTS",
        "web-0            1/1     0",
        "train-master-0   0/1     3",
    ]


def test_wide_namespace_labels_and_prefix():
    view = TableView.from_response(TABLE)
    lines = TablePrinter(wide=True, with_namespace=True, show_labels=True, name_prefix="pod/").lines(view)
    assert lines[0].split() == ["NAMESPACE", "NAME", "READY", "RESTARTS", "IP", "LABELS"]
    assert lines[1].split() == ["default", "pod/web-0", "1/1", "0", "10.0.0.5", "app=web,tier=fe"]
    assert lines[2].split() == ["team-a", "pod/train-master-0", "0/1", "3", "<none>", "<none>"]


def test_watch_rows_keep_header_widths():
    printer = TablePrinter()
    printer.lines(TableView.from_response(TABLE))
    later = printer.lines(TableView.from_response(_table((["a", "1/1", 1, None], "default", {}))), header=False)
    assert later == ["a                1/1     1"]


def test_plain_list_falls_back_to_name_and_age():
    view = TableView.from_response({"kind": "PodList", "items": [
        {"metadata": {"name": "x", "creationTimestamp": "2000-01-01T00:00:00Z"}}]})
    lines = TablePrinter().lines(view)
    assert lines[0].split() == ["NAME", "AGE"]
    assert lines[1].split()[0] == "x"


def test_format_table_last_column_unpadded():
    assert format_table(["A", "LONGER"], [["xxxx", "y"]]) == ["A      LONGER", "xxxx   y"]


def test_human_duration_matches_kubectl():
    cases = {0: "0s", 59: "59s", 119: "119s", 120: "2m", 125: "2m5s", 600: "10m", 3 * 3600: "3h",
             3 * 3600 + 60: "3h1m", 10 * 3600: "10h", 50 * 3600: "2d2h", 9 * 86400: "9d", 800 * 86400: "2y70d"}
    for seconds, text in cases.items():
        assert human_duration(seconds) == text, seconds


def test_parse_duration():
    assert parse_duration("90") == 90
    assert parse_duration("1m30s") == 90
    assert parse_duration("2h") == 7200


def test_invalid_error_is_rebuilt_from_causes():
    status = {"kind": "Status", "code": 422, "reason": "Invalid",
              "message": 'Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: must be >= 0',
              "details": {"name": "web", "kind": "Deployment", "causes": [
                  {"field": "spec.replicas", "message": "Invalid value: -1: must be greater than or equal to 0"}]}}
    e = error_from_status(status)
    assert api_error_message(e) == ('The Deployment "web" is invalid: spec.replicas: Invalid value: -1: '
                                    "must be greater than or equal to 0")
    assert problem_text(e) == "spec.replicas: Invalid value: -1: must be greater than or equal to 0"


def test_not_found_reads_like_kubectl():
    e = error_from_status({"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "x" not found'})
    assert api_error_message(e) == 'Error from server (NotFound): pods "x" not found'


def test_describe_doc_aligns_blocks_and_tables():
    doc = Doc()
    doc.kv(0, "Name", "web")
    doc.mapping(0, "Labels", {"b": "2", "a": "1"})
    doc.kv(0, "Annotations", "<none>")
    doc.title(0, "Events:")
    doc.table(1, ["Type", "Reason"], [["Warning", "FailedScheduling"]])
    assert doc.render().splitlines() == [
        "Name:         web",
        "Labels:       a=1",
        "              b=2",
        "Annotations:  <none>",
        "Events:",
        "  Type     Reason",
        "  ----     ------",
        "  Warning  FailedScheduling",
    ]


def test_quantities_and_labels():
    assert parse_quantity("100m") * 10 == 1
    assert parse_quantity("1Gi") == 2**30
    assert format_quantity("cpu", parse_quantity("1500m")) == "1500m"
    assert format_quantity("cpu", parse_quantity("2")) == "2"
    assert format_quantity("memory", parse_quantity("1536Mi")) == "1536Mi"
    assert format_quantity("memory", parse_quantity("2Gi")) == "2Gi"
    assert format_quantity("nvidia.com/gpu", parse_quantity("4")) == "4"
    assert smart_label("pytorchReplicaSpecs") == "Pytorch Replica Specs"
    assert smart_label("nvidia.com/gpu") == "nvidia.com/gpu"
    assert selector_text({"matchLabels": {"app": "web"},
                          "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}) \
        == "app=web,tier in (a,b)"


def test_describe_node_counts_a_pod_as_kubernetes_does() -> None:
    # kubectl's PodRequestsAndLimits: sidecars add to the containers and overhead is added;
    # describe used to take max(containers, init containers) without overhead (1 cpu here).
    from gpufleet.cli.commands.describe import pod_resources

    one = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    pod = {"spec": {"containers": [{"name": "a", "resources": one}],
                    "initContainers": [{"name": "log", "restartPolicy": "Always", "resources": one}],
                    "overhead": {"cpu": "100m"}}}
    requests, limits = pod_resources(pod)
    assert format_quantity("cpu", requests["cpu"]) == "2100m"
    assert format_quantity("cpu", limits["cpu"]) == "2100m"
    assert format_quantity("cpu", parse_quantity("0.5")) == "500m"
    assert format_quantity("nvidia.com/gpu", parse_quantity("0.5")) == "0.5"
