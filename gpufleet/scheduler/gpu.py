"""The GPU vocabulary, for the scheduler's modules: it lives in gpufleet.api.gpu, below every
component that shares it."""

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

__all__ = ['GPU_RESOURCE', 'GPU_PRODUCT_LABEL', 'GPU_MEMORY_LABEL', 'ZONE_LABEL', 'RACK_LABEL', 'GPUS_ANNOTATION', 'GPU_INDICES_ANNOTATION', 'GPU_TOPOLOGY_ANNOTATION', 'GPU_MEMORY_MIN_ANNOTATION', 'SCHEDULING_DIAGNOSIS_ANNOTATION', 'SAME_GROUP', 'HEALTHY', 'DEFAULT_GROUP', 'GPUDevice', 'parse_gpus_annotation', 'parse_gpu_indices', 'format_gpu_indices']
