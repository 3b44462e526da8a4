"""Field ownership: ``metadata.managedFields`` for server-side apply and for ordinary writes.

Kubernetes records, for every object, which *field manager* set which fields
(``sigs.k8s.io/structured-merge-diff`` on the server). The functions here compute the same
records over objects held as JSON dicts; they do no I/O and never mutate their inputs.

Field sets
----------
A field is named by a path of elements written as in ``fieldsV1``:

- ``f:<name>``    a key of an object (``f:spec``, ``f:app`` inside ``f:labels``);
- ``k:<json>``    an item of an associative list, by its merge keys (``k:{"name":"web"}``);
- ``v:<json>``    a value of a list of scalars treated as a set (``v:"kubernetes"``);
- ``i:<n>``       a list index (only read from clients; never produced here).

A :data:`FieldSet` holds the paths a manager owns. Scalars, atomic values, list items and
empty objects are members; objects that hold other fields are not (their ``.`` entry in
``fieldsV1`` only appears when the object itself is owned).

Which lists merge by key comes from the strategic-merge schema in :mod:`patch`, plus what
the OpenAPI of Kubernetes adds on top of the patch tags: container and service ports are
keyed by port *and* protocol (protocol defaults to ``TCP`` in the key), a workload's
``spec.selector`` (a ``LabelSelector``) is atomic, and a list with no merge tag is atomic
(so ``args`` or ``tolerations`` are owned as a whole). Objects without a schema are granular.

Apply and update
----------------
:func:`apply` is the ``application/apply-patch+yaml`` PATCH: the configuration is merged
into the live object, the manager's previous configuration is compared with the new one
and fields it no longer applies are removed unless another manager owns them, and fields
that another manager owns and that the configuration changes are conflicts (409) unless
``force`` moves them. :func:`record_update` is everything else (create, PUT, the other
PATCH types): the fields a write adds or changes become the writer's.

What is reproduced from kube-apiserver's field manager, beyond the core algorithm:

- entries are keyed by (manager, operation, apiVersion for updates, subresource), sorted
  Apply first, then by time, manager, apiVersion and subresource;
- ``apiVersion``, ``kind`` and the system metadata (name, namespace, uid, resourceVersion,
  generation, creationTimestamp, selfLink, managedFields) are never owned;
- a manager's ``time`` only moves when the write changed something; an apply that changes
  nothing returns the live object as it was;
- at most ten update entries are kept: older ones fold into ``ancient-changes``;
- an existing object without managedFields is not tracked by updates; the first apply to
  it attributes its current fields to ``before-first-apply``;
- a client resets managedFields with ``[]`` or ``[{}]`` (not with apply); other
  client-sent managedFields on an update are used when they decode, else the live ones;
- ``kubectl``'s server-side apply may take over fields listed in the client-side
  ``last-applied-configuration`` annotation without a conflict, and keeps that annotation
  in step with what it applies.

Layout: `common` (paths, limits, errors, manager names), `fieldsets` (the ownership schema,
field sets and fieldsV1), `merge` (compare, merge, prune), `entries` (managedFields entries)
and `operations` (record_update, apply).
"""

from gpufleet.apiserver.managedfields.common import (
    ANCIENT_CHANGES_MANAGER,
    BEFORE_FIRST_APPLY_MANAGER,
    LAST_APPLIED_ANNOTATION,
    MAX_FIELD_PATH_DEPTH,
    MAX_UPDATE_MANAGERS,
    FieldPath,
    FieldSet,
    ManagedFieldsError,
    field_manager_errors,
    manager_from_user_agent,
)
from gpufleet.apiserver.managedfields.entries import is_reset
from gpufleet.apiserver.managedfields.fieldsets import field_set, from_fields_v1, path_string, to_fields_v1
from gpufleet.apiserver.managedfields.operations import (
    ApplyConflict,
    accepted_managed_fields,
    apply,
    record_update,
)

__all__ = [
    "ANCIENT_CHANGES_MANAGER",
    "BEFORE_FIRST_APPLY_MANAGER",
    "LAST_APPLIED_ANNOTATION",
    "MAX_FIELD_PATH_DEPTH",
    "MAX_UPDATE_MANAGERS",
    "ApplyConflict",
    "FieldPath",
    "FieldSet",
    "ManagedFieldsError",
    "accepted_managed_fields",
    "apply",
    "field_manager_errors",
    "field_set",
    "from_fields_v1",
    "is_reset",
    "manager_from_user_agent",
    "path_string",
    "record_update",
    "to_fields_v1",
]

