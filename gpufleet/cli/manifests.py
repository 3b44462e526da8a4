"""Reading manifests from files, directories and stdin, remembering where each object came
from, so every problem can be reported as `deploy.yaml (document 2): ...`.

A YAML stream is split into its documents before parsing: a syntax error in one document
is reported with its own number and line, and the documents after it are still read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

STDIN = "-"
STDIN_NAME = "<stdin>"
_SUFFIXES = (".yaml", ".yml", ".json")
# A line that starts a new YAML document (`---`, optionally followed by content or a
# comment) or ends one (`...`). At column 0 these always end the previous document, even
# inside a block scalar, so splitting on them is safe.
_DOC_START = re.compile(r"^---(?:[ \t].*)?$")
_DOC_END = re.compile(r"^\.\.\.[ \t]*$")

# The order `apply` creates kinds in: things others live in or refer to first (namespaces,
# priority classes, queues, config), then the workloads that use them. Unknown kinds go
# last, keeping their order in the files.
APPLY_ORDER = [
    "Namespace",
    "PriorityClass",
    "ResourceFlavor",
    "ClusterQueue",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "LocalQueue",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "PodGroup",
    "Pod",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "PyTorchJob",
    "RayCluster",
    "RayJob",
    "RayService",
    "Ingress",
]
_ORDER_INDEX = {k: i for i, k in enumerate(APPLY_ORDER)}


@dataclass
class Manifest:
    source: str
    # 1-based among the non-empty documents of the source.
    index: int
    obj: dict[str, Any]
    # 1-based position inside a `kind: List` document, else None.
    item: int | None = None

    @property
    def where(self) -> str:
        return location(self.source, self.index, self.item)

    @property
    def api_version(self) -> str:
        return str(self.obj.get("apiVersion") or "")

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "")

    @property
    def metadata(self) -> dict[str, Any]:
        m = self.obj.get("metadata")
        return m if isinstance(m, dict) else {}

    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or "")

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "")

    @property
    def title(self) -> str:
        """`Deployment "web"`: the object as named in messages."""
        return f'{self.kind or "object"} "{self.name}"' if self.name else (self.kind or "object")


@dataclass
class ManifestError:
    source: str
    # 0 when the problem is the file itself (missing, unreadable).
    index: int
    message: str
    item: int | None = None

    @property
    def where(self) -> str:
        return location(self.source, self.index, self.item)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class LoadResult:
    manifests: list[Manifest] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        self.manifests += other.manifests
        self.errors += other.errors


def location(source: str, index: int, item: int | None = None) -> str:
    if not index:
        return source
    where = f"{source} (document {index}"
    if item is not None:
        where += f", item {item}"
    return where + ")"


def expand_paths(paths: Sequence[str], *, recursive: bool = False) -> tuple[list[str], list[ManifestError]]:
    """Files to read, in order: each file as given, a directory's *.yaml/*.yml/*.json sorted
    by name (with `recursive`, its subdirectories' too), and `-` for stdin."""
    files: list[str] = []
    errors: list[ManifestError] = []
    for raw in paths:
        if raw == STDIN:
            files.append(STDIN)
            continue
        p = Path(raw).expanduser()
        if p.is_dir():
            pattern = "**/*" if recursive else "*"
            found = sorted(
                (f for f in p.glob(pattern) if f.is_file() and f.suffix.lower() in _SUFFIXES),
                key=lambda f: f.relative_to(p).parts,
            )
            files += [str(f) for f in found]
        elif p.exists():
            files.append(raw)
        else:
            errors.append(ManifestError(raw, 0, f'the path "{raw}" does not exist'))
    return files, errors


def load(paths: Sequence[str], *, stdin: TextIO | None = None, recursive: bool = False) -> LoadResult:
    files, errors = expand_paths(paths, recursive=recursive)
    result = LoadResult(errors=errors)
    for f in files:
        if f == STDIN:
            import sys

            text = (stdin or sys.stdin).read()
            result.extend(parse_text(text, STDIN_NAME))
            continue
        try:
            text = Path(f).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            result.errors.append(ManifestError(f, 0, f"cannot read the file: {e}"))
            continue
        result.extend(parse_text(text, f, json_file=f.lower().endswith(".json")))
    return result


def parse_text(text: str, source: str, *, json_file: bool = False) -> LoadResult:
    """Every object in one file's text: YAML documents, or JSON (one value), with `kind: List`
    documents expanded into their items."""
    result = LoadResult()
    stripped = text.lstrip()
    if json_file or stripped.startswith(("{", "[")):
        try:
            value = json.loads(text)
        except ValueError as e:
            if json_file:
                result.errors.append(ManifestError(source, 1, f"JSON syntax error: {e}"))
                return result
        else:
            _add_document(result, source, 1, value)
            return result
    index = 0
    for first_line, chunk in split_documents(text):
        try:
            value = yaml.safe_load(chunk)
        except yaml.YAMLError as e:
            index += 1
            result.errors.append(ManifestError(source, index, _yaml_error(e, first_line)))
            continue
        if value is None:
            continue
        index += 1
        _add_document(result, source, index, value)
    return result


def split_documents(text: str) -> list[tuple[int, str]]:
    """The documents of a YAML stream as (0-based line where it starts, text). Document
    markers stay out of the text; everything before the first `---` is a document too."""
    docs: list[tuple[int, str]] = []
    start, buf = 0, []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _DOC_START.match(line) or _DOC_END.match(line):
            docs.append((start, "\n".join(buf)))
            buf = []
            start = i + 1
            rest = line[3:].strip() if line.startswith("---") else ""
            if rest and not rest.startswith("#"):
                # `--- !tag` or `--- {inline}`: the content starts on the marker line.
                buf.append(rest)
                start = i
            continue
        buf.append(line)
    docs.append((start, "\n".join(buf)))
    return docs


def _yaml_error(e: yaml.YAMLError, first_line: int) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    where = ""
    if mark is not None:
        where = f" at line {mark.line + 1 + first_line}, column {mark.column + 1}"
    text = f"YAML syntax error{where}: {problem}"
    if context:
        text += f" ({context})"
    return text


def _add_document(result: LoadResult, source: str, index: int, value: Any) -> None:
    if isinstance(value, dict) and value.get("kind") == "List" and isinstance(value.get("items"), list):
        for n, item in enumerate(value["items"], start=1):
            problem = check_object(item)
            if problem:
                result.errors.append(ManifestError(source, index, problem, n))
            else:
                result.manifests.append(Manifest(source, index, item, n))
        return
    problem = check_object(value)
    if problem:
        result.errors.append(ManifestError(source, index, problem))
    else:
        result.manifests.append(Manifest(source, index, value))


def check_object(value: Any) -> str | None:
    """What makes a document unusable as an object, or None."""
    if not isinstance(value, dict):
        return f"expected an object with apiVersion and kind, got {_describe(value)}"
    missing = [k for k in ("apiVersion", "kind") if not value.get(k)]
    if missing:
        return ", ".join(f"{k} not set" for k in missing)
    for k in ("apiVersion", "kind"):
        if not isinstance(value[k], str):
            return f"{k} must be a string, got {_describe(value[k])}"
    m = value.get("metadata")
    if m is not None and not isinstance(m, dict):
        return f"metadata must be a mapping, got {_describe(m)}"
    if isinstance(m, dict):
        for k in ("name", "namespace"):
            if k in m and m[k] is not None and not isinstance(m[k], str):
                return f"metadata.{k} must be a string, got {_describe(m[k])}"
    return None


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return type(value).__name__


def sort_for_apply(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Stable: kinds by APPLY_ORDER, unknown kinds after, file order within a kind."""
    return sorted(manifests, key=lambda m: _ORDER_INDEX.get(m.kind, len(APPLY_ORDER)))
