"""Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).

kubectl 1.32 and later send the typed objects of its imperative commands (`create namespace`,
`create deployment`, `create configmap`, ...) as protobuf and do not retry with JSON when the
server answers 415, so the server has to read them. This module turns such a body into the
camelCase JSON dict that the same kubectl would have sent as JSON, so that everything after
body parsing (defaulting, strict field validation, admission, storage) stays JSON-only.

Wire format: the 4-byte magic ``k8s\\x00`` followed by a ``runtime.Unknown`` message
(typeMeta{apiVersion=1, kind=2}=1, raw=2, contentEncoding=3, contentType=4) whose ``raw`` is
the object encoded as the message of its kind (go-to-protobuf, proto2 syntax).

The JSON a Go client writes is not "every field that is set": it follows the Go struct tags.
Kubernetes' protobuf marshaller writes every non-pointer field, zero or not, and pointer fields
only when non-nil; the JSON encoder drops zero scalars and empty collections tagged
``omitempty``, always writes untagged ones, and always writes non-pointer structs (``{}`` when
empty). The schema below therefore records, per field, the Go shape as well as the wire type,
and the decoder reproduces the JSON side of each rule: ``creationTimestamp: null``,
``resources: {}``, ``strategy: {}``, ``status: {}`` and ``value: 0`` come out exactly as a JSON
client would have sent them.

Coverage is what kubectl's imperative creates and ordinary workloads carry (ObjectMeta,
Namespace, ConfigMap, Secret, ServiceAccount, ResourceQuota, Service, Pod/PodSpec/Container,
Deployment, ReplicaSet, Job, CronJob, PriorityClass, Role, ClusterRole, RoleBinding,
ClusterRoleBinding, PodDisruptionBudget, HorizontalPodAutoscaler, and TokenRequest for
`kubectl create token`). Errors are explicit rather
than lossy:

* a field number a modelled message does not define -> 400 BadRequest naming the message and
  the number (a newer client may set a field this table predates; dropping it silently would
  store an object other than the one sent);
* a known field whose type is deliberately not modelled (probes, lifecycle hooks, exotic volume
  sources, container statuses) -> 400 naming the field and asking for JSON;
* a kind the registry knows but this table does not model -> 415, like before this module;
* a kind the registry does not know -> 400, as kube-apiserver answers.

The schema tables are in `schema_core` (meta/v1, core/v1) and `schema` (the other groups);
the wire reader and decoder are in `decode`.
"""

from gpufleet.apiserver.protobuf.decode import CONTENT_TYPE, MAGIC, ProtobufDecodeError, decode_k8s_protobuf
from gpufleet.apiserver.protobuf.schema import KINDS, SCHEMA, SUBRESOURCE_KINDS

__all__ = [
    "CONTENT_TYPE",
    "KINDS",
    "MAGIC",
    "SCHEMA",
    "SUBRESOURCE_KINDS",
    "ProtobufDecodeError",
    "decode_k8s_protobuf",
]
