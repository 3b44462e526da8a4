"""CustomResourceDefinitions the custom resource tests share (a dict each, as kubectl sends)."""

from __future__ import annotations

import copy
from typing import Any

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"

_WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A widget of the example shop.",
    "properties": {
        "spec": {
            "type": "object",
            "description": "What the widget should be.",
            "required": ["color"],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3, "description": "How big."},
                "color": {"type": "string", "enum": ["red", "blue"], "description": "Its colour."},
                "label": {"type": "string", "maxLength": 8, "pattern": "^[a-z-]+$"},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "port": {"x-kubernetes-int-or-string": True},
            },
        },
        "status": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"phase": {"type": "string"}, "replicas": {"type": "integer"}},
        },
    },
}


def widget_crd(**spec_changes: Any) -> dict[str, Any]:
    """widgets.example.com: namespaced, a schema with defaults, printer columns, status and scale."""
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size",
                                                          "statusReplicasPath": ".status.replicas"}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": copy.deepcopy(_WIDGET_SCHEMA)},
            }],
        },
    }
    crd["spec"].update(spec_changes)
    return crd


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": spec or {"color": "red"}}


def upstream_pytorchjob_crd() -> dict[str, Any]:
    """The Kubeflow training operator's pytorchjobs.kubeflow.org CRD as its manifests ship it
    (controller-gen's header, names, printer columns and empty status), its 500 KB schema
    cut to the top level."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"annotations": {"controller-gen.kubebuilder.io/version": "v0.6.0"},
                     "creationTimestamp": None, "name": "pytorchjobs.kubeflow.org"},
        "spec": {
            "group": "kubeflow.org",
            "names": {"kind": "PyTorchJob", "listKind": "PyTorchJobList", "plural": "pytorchjobs",
                      "singular": "pytorchjob"},
            "scope": "Namespaced",
            "versions": [{
                "additionalPrinterColumns": [
                    {"jsonPath": ".status.conditions[-1:].type", "name": "State", "type": "string"},
                    {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"}],
                "name": "v1",
                "schema": {"openAPIV3Schema": {
                    "description": "PyTorchJob Represents a PyTorchJob resource.",
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    "required": ["spec"], "type": "object"}},
                "served": True, "storage": True,
                "subresources": {"scale": {"labelSelectorPath": ".status.replicaStatuses.Worker.selector",
                                           "specReplicasPath": ".spec.pytorchReplicaSpecs.Worker.replicas",
                                           "statusReplicasPath": ".status.replicaStatuses.Worker.active"},
                                 "status": {}}}],
        },
        "status": {"acceptedNames": {"kind": "", "plural": ""}, "conditions": [], "storedVersions": []},
    }
