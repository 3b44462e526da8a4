"""A custom resource's schema at work (pruning, defaults, validation) and printer-column JSONPath."""

from __future__ import annotations

from gpufleet.api import jsonpath, structural

SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "replicas": {"type": "integer", "default": 1},
                "ratio": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
                "mode": {"type": "string", "nullable": True},
                "items": {"type": "array", "minItems": 1,
                          "items": {"type": "object", "properties": {"name": {"type": "string", "minLength": 2}},
                                    "required": ["name"]}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "when": {"type": "string", "format": "date-time"},
            },
        },
    },
}


def test_prune_drops_and_names_what_the_schema_does_not_specify() -> None:
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}, "top": 1,
           "spec": {"replicas": 2, "bogus": True, "items": [{"name": "ab", "x": 1}], "labels": {"a": "b"},
                    "free": {"anything": {"goes": 1}}}}
    assert structural.prune(obj, SCHEMA) == ["top", "spec.bogus", "spec.items[0].x"]
    assert obj == {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
                   "spec": {"replicas": 2, "items": [{"name": "ab"}], "labels": {"a": "b"},
                            "free": {"anything": {"goes": 1}}}}


def test_defaults_fill_missing_fields_and_nulls_without_nullable_go() -> None:
    obj = {"spec": {"ratio": None, "mode": None}}
    structural.apply_defaults(obj, SCHEMA)
    assert obj == {"spec": {"replicas": 1, "mode": None}}
    replaced = {"spec": {"replicas": None}}
    structural.apply_defaults(replaced, SCHEMA)
    assert replaced == {"spec": {"replicas": 1}}


def test_validation_words_each_problem_as_kubernetes_does() -> None:
    obj = {"spec": {"replicas": 1.0, "ratio": 0, "items": [{"name": "a"}, {}], "labels": {"k": 3},
                    "when": "yesterday"}}
    messages = [e.message() for e in structural.validate(obj, SCHEMA)]
    assert messages == [
        "spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0",
        'spec.items[0].name: Invalid value: "a": spec.items[0].name in body should be at least 2 chars long',
        "spec.items[1].name: Required value",
        'spec.labels.k: Invalid value: "integer": spec.labels.k in body must be of type string: "integer"',
        'spec.when: Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday"',
    ]
    assert structural.validate({"spec": {"items": []}}, SCHEMA)[0].message() == \
        "spec.items: Invalid value: 0: spec.items in body should have at least 1 items"


def test_jsonpath_reads_printer_columns() -> None:
    obj = {"metadata": {"labels": {"app.kubernetes.io/name": "web"}},
           "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Done", "status": "True"}]},
           "spec": {"containers": [{"image": "a"}, {"image": "b"}]}}
    assert jsonpath.find(obj, ".status.conditions[-1:].type") == ["Done"]
    assert jsonpath.find(obj, '.status.conditions[?(@.type=="Ready")].status') == ["False"]
    assert jsonpath.find(obj, "{.spec.containers[*].image}") == ["a", "b"]
    assert jsonpath.find(obj, ".spec.containers[1].image") == ["b"]
    assert jsonpath.find(obj, ".metadata.labels['app\\.kubernetes\\.io/name']") == ["web"]
    assert jsonpath.find(obj, ".spec.missing.deeper") == []
    assert jsonpath.find(obj, ".spec[?(oops") == []
