"""The GPU vocabulary lives in :mod:`gpufleet.api.gpu`; these names are re-exported for
imports that still say ``gpufleet.scheduler.gpu``."""

from gpufleet.api.gpu import (
    DEFAULT_GROUP,
    GPU_INDICES_ANNOTATION,
    GPU_MEMORY_LABEL,
    GPU_MEMORY_MIN_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_TOPOLOGY_ANNOTATION,
    GPUS_ANNOTATION,
    HEALTHY,
    RACK_LABEL,
    SAME_GROUP,
    SCHEDULING_DIAGNOSIS_ANNOTATION,
    ZONE_LABEL,
    GPUDevice,
    format_gpu_indices,
    parse_gpu_indices,
    parse_gpus_annotation,
)

__all__ = [
    "DEFAULT_GROUP",
    "GPUS_ANNOTATION",
    "GPU_INDICES_ANNOTATION",
    "GPU_MEMORY_LABEL",
    "GPU_MEMORY_MIN_ANNOTATION",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "GPU_TOPOLOGY_ANNOTATION",
    "HEALTHY",
    "RACK_LABEL",
    "SAME_GROUP",
    "SCHEDULING_DIAGNOSIS_ANNOTATION",
    "ZONE_LABEL",
    "GPUDevice",
    "format_gpu_indices",
    "parse_gpu_indices",
    "parse_gpus_annotation",
]
