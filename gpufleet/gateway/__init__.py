"""Service gateway: load balancing onto Ready endpoints, request statistics, scale from zero."""

from gpufleet.gateway.gateway import Gateway

__all__ = ["Gateway"]
