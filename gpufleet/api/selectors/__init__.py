"""Label and field selectors with Kubernetes semantics.

Label selectors come in two shapes that must agree exactly:
- the string form of ``kubectl -l`` and ``?labelSelector=`` (``app=web,tier in (fe,be),!canary``),
  parsed here by a port of apimachinery's ``labels.Parse`` grammar, with its error texts;
- the structured form of ``Deployment.spec.selector`` (``matchLabels`` / ``matchExpressions``),
  converted like ``metav1.LabelSelectorAsSelector``.

Nil versus empty, which Kubernetes distinguishes and so do we:
- ``LabelSelector.everything()`` has no requirements and matches every object. It is what an
  empty string, an empty structured selector (``{}``) and an empty label set give.
- ``LabelSelector.nothing()`` matches no object. It is what a *missing* structured selector
  (``None``) gives: a PodDisruptionBudget or a controller without a selector selects nothing,
  never everything. ``str()`` of it is "" like Kubernetes', so it cannot be sent as a string.
``empty()`` is Kubernetes' ``Selector.Empty()``: true only for a selector that restricts
nothing (``everything()``), false for ``nothing()``.

Field selectors (``?fieldSelector=metadata.name=web,status.phase!=Running``) follow
apimachinery's ``fields.ParseSelector``: only ``=``, ``==`` and ``!=``, comma-separated, with
``\\,`` ``\\=`` and ``\\\\`` escapes in values.
"""

from gpufleet.api.selectors.fields import (
    FieldRequirement,
    FieldSelector,
    escape_field_value,
    field_value,
    parse_field_selector,
)
from gpufleet.api.selectors.labels import (
    LabelSelector,
    Operator,
    Requirement,
    SelectorError,
    label_value_errors,
    parse_label_selector,
    qualified_name_errors,
)

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Operator",
    "Requirement",
    "SelectorError",
    "escape_field_value",
    "field_value",
    "label_value_errors",
    "parse_field_selector",
    "parse_label_selector",
    "qualified_name_errors",
]
