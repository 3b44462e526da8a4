"""From a request body to a checked, defaulted, validated object of a kind.

``parse_body`` reads the body in the request's content type; ``check_type`` holds it to the
kind and version of the URL; ``decode`` gives the typed model, naming unknown fields and
wrong types as Kubernetes does under fieldValidation; ``finish`` defaults and validates it
(the kind's Strategy holds the validation) and gives the wire form back.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gpufleet.api import defaults as api_defaults
from gpufleet.api.registry import REGISTRY, ResourceType
from gpufleet.apiserver.errors import ApiException, bad_request, invalid
from gpufleet.apiserver.limits import off_loop
from gpufleet.apiserver.patch import PatchError, decode_json, decode_yaml
from gpufleet.apiserver.strategy import Strategy, strategy_for
from gpufleet.utils.http import RawRequest

JSON = "application/json"
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json", "application/apply-patch+yaml")


def field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _delete_path(obj: Any, loc: tuple) -> None:
    cur = obj
    for part in loc[:-1]:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(cur, dict):
        cur.pop(loc[-1], None)


async def parse_body(req: RawRequest) -> Any:
    """The request's object, decoded from JSON, YAML or Kubernetes protobuf (off the event
    loop for a large body: limits.off_loop)."""
    ctype = req.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if not req.body:
        raise bad_request("the request body is empty: send the object as JSON")
    if ctype == "application/vnd.kubernetes.protobuf":
        from gpufleet.apiserver.protobuf import decode_k8s_protobuf

        return await off_loop(decode_k8s_protobuf, req.body, REGISTRY)
    if "protobuf" in ctype or ctype in PATCH_TYPES:
        raise ApiException(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
    try:
        return await off_loop(decode_yaml if "yaml" in ctype else decode_json, req.body)
    except PatchError as e:
        raise bad_request(f"the body of the request could not be decoded as {ctype or 'JSON'}: {e}") from None


def check_type(rt: ResourceType, body: Any) -> dict[str, Any]:
    """The body as an object of rt's kind and version (apiVersion and kind filled in)."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a {rt.kind} object, got {type(body).__name__}")
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if kind not in (None, "", rt.kind) or api_version not in (None, "", rt.api_version):
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({rt.api_version})" if api_version not in (None, "", rt.api_version)
            else f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
        )
    body["apiVersion"], body["kind"] = rt.api_version, rt.kind
    meta = body.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            raise bad_request("metadata: Invalid value: must be an object (ObjectMeta)",
                              [{"reason": "FieldValueTypeInvalid", "field": "metadata",
                                "message": "must be an object"}])
        for key in ("name", "generateName", "namespace", "uid", "resourceVersion"):
            if meta.get(key) is not None and not isinstance(meta[key], str):
                raise bad_request(f"metadata.{key}: Invalid value: {meta[key]!r}: must be a string",
                                  [{"reason": "FieldValueTypeInvalid", "field": f"metadata.{key}",
                                    "message": "must be a string"}])
    return body


def decode(rt: ResourceType, obj: dict[str, Any], name: str, field_validation: str | None):
    """Typed check of the wire object. Returns (model, warnings). Unknown fields follow
    fieldValidation like Kubernetes: Strict rejects, Warn (the default) and Ignore drop them."""
    mode = (field_validation or "Warn").capitalize()
    model_cls = rt.model
    custom = getattr(model_cls, "decode_custom", None)
    if custom is not None:  # a custom resource: pruned and defaulted by its schema
        return custom(obj, name, mode)
    warnings: list[str] = []
    for _ in range(3):
        try:
            return model_cls.model_validate(obj), warnings
        except ValidationError as e:
            errors = e.errors(include_url=False)
        unknown = [err for err in errors if err["type"] == "extra_forbidden"]
        missing = [err for err in errors if err["type"] == "missing"]
        other = [err for err in errors if err["type"] not in ("extra_forbidden", "missing")]
        if other:
            causes = [
                {"reason": "FieldValueInvalid", "message": f"Invalid value: {err['msg']}",
                 "field": field_path(err["loc"])} for err in other
            ]
            listed = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {listed}', causes
            )
        if unknown and mode == "Strict":
            names = ", ".join(f'unknown field "{field_path(err["loc"])}"' for err in unknown)
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {names}",
                [{"reason": "FieldValueInvalid", "message": f'unknown field "{field_path(err["loc"])}"',
                  "field": field_path(err["loc"])} for err in unknown],
            )
        if unknown:
            if mode == "Warn":
                warnings += [f'unknown field "{field_path(err["loc"])}"' for err in unknown]
            for err in sorted(unknown, key=lambda x: len(x["loc"]), reverse=True):
                _delete_path(obj, err["loc"])
            if not missing:
                continue
        if missing:
            raise invalid(rt, name, [
                {"reason": "FieldValueRequired", "message": "Required value", "field": field_path(err["loc"])}
                for err in missing
            ])
    raise bad_request(f"{rt.kind} could not be decoded")


def finish(rt: ResourceType, model: Any, name: str, old_model: Any | None,
           strategy: Strategy | None = None) -> dict[str, Any]:
    """Defaults, then the kind's validation (create when old_model is None, else update);
    the object in wire form, without empty metadata maps and lists."""
    api_defaults.apply_defaults(model)
    errors = (strategy or strategy_for(rt)).validate(model, old_model)
    if errors:
        raise invalid(rt, name, [
            {"reason": e.type, "message": e.message().split(": ", 1)[1] if e.field else e.message(),
             "field": e.field} for e in errors
        ])
    try:
        out = model.to_dict()
    except ValueError as e:  # pydantic refuses to serialize nesting past its depth limit
        raise bad_request(f"{rt.kind} in version \"{rt.version}\" cannot be handled as a {rt.kind}: "
                          f"{e}: the object nests too deeply") from None
    meta = out.get("metadata")
    if meta:
        # Kubernetes omits empty metadata maps and lists (a removed last label leaves no `labels: {}`).
        for key in ("labels", "annotations", "finalizers", "ownerReferences"):
            if key in meta and not meta[key]:
                del meta[key]
    return out
