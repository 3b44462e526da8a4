"""Quantities of the custom-resource kinds (PyTorchJob, PodGroup, the Kueue kinds), kept as sent.

A real API server stores a custom object as its client wrote it: where the CRD's schema says
int-or-string (``nominalQuota: 2``, a PodGroup's ``minResources``, the ``nvidia.com/gpu: 1`` in
a PyTorchJob's pod template), a JSON number stays a number and a string stays a string. Only
built-in kinds normalize, because their Go Quantity type always serializes as a string.

That difference is visible: for a custom resource kubectl's client-side apply diffs the live
object against the manifest with a JSON merge patch, so a server that turned ``2`` into ``"2"``
would report every re-apply of an unchanged manifest as "configured".

- :data:`IntOrStringQuantity` is the field type for such quantities: an integer, a number or a
  string, kept as given (validation still checks that it parses as a quantity).
- :class:`KeepsTemplateNumbers` is the base of a model whose ``template`` is a built-in
  ``PodTemplateSpec`` (typed, so validation and controllers see Kubernetes' string quantities)
  and that must still write back the numbers its client sent there.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    PlainValidator,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)

from gpufleet.api.k8s import K8sModel

Path = tuple[str | int, ...]


def _int_or_string(value: Any) -> int | float | str:
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string such as 8 or 500m, not a boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a quantity must be a finite number")
    if isinstance(value, int | float | str):
        return value
    raise ValueError(f"a quantity is a number or a string such as 8 or 500m, not {type(value).__name__}")


# Published as Kubernetes publishes its own int-or-string fields (IntOrString in the OpenAPI of
# the built-in kinds): a string in the format "int-or-string", which `kubectl explain` shows as
# <string>, as it does for a quantity.
IntOrStringQuantity = Annotated[
    int | float | str,
    PlainValidator(_int_or_string),
    WithJsonSchema({"type": "string", "format": "int-or-string"}),
]


def quantity_text(number: int | float) -> str:
    """How a built-in Quantity field writes a number it was given (``1`` -> ``"1"``)."""
    if isinstance(number, float):
        return str(int(number)) if number.is_integer() else repr(number)
    return str(number)


def sent_numbers(data: Any, path: Path = ()) -> dict[Path, int | float]:
    """Every JSON number in ``data``, by its path of keys and list indexes."""
    found: dict[Path, int | float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            found.update(sent_numbers(value, (*path, key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found.update(sent_numbers(value, (*path, i)))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        found[path] = data
    return found


def restore_numbers(out: Any, numbers: dict[Path, int | float]) -> Any:
    """Put back the numbers a Quantity turned into strings; ``out`` is changed in place.

    Only a string that is exactly the number's quantity text is replaced, so a value changed
    since it was sent, or a field that was never a quantity, keeps what it has."""
    for path, number in numbers.items():
        parent = out
        for step in path[:-1]:
            try:
                parent = parent[step]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        if not isinstance(parent, dict | list):
            continue
        leaf = path[-1]
        try:
            value = parent[leaf]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(value, str) and value == quantity_text(number):
            parent[leaf] = number  # type: ignore[index]
    return out


class KeepsTemplateNumbers(K8sModel):
    """A model with a ``template`` field (a built-in PodTemplateSpec) that writes back the JSON
    numbers its input had there.

    The typed template holds strings, as a Pod does, for validation and for the pods made from
    it; the numbers are remembered when the model is read from JSON and restored when it is
    written, so the custom object round-trips as its client sent it."""

    _template_numbers: dict[Path, int | float] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_template_numbers(cls, data: Any, handler: Any) -> Any:
        model = handler(data)
        if isinstance(data, dict) and isinstance(data.get("template"), dict):
            model._template_numbers = sent_numbers(data["template"])
        return model

    @model_serializer(mode="wrap")
    def _write_template_numbers(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if self._template_numbers and isinstance(out, dict) and isinstance(out.get("template"), dict):
            restore_numbers(out["template"], self._template_numbers)
        return out
