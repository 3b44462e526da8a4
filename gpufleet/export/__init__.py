"""Rendering a gpufleet cluster's objects as manifests for a real Kubernetes cluster
(`gpufleet export`); re-applying them to gpufleet recreates the same objects."""

from gpufleet.export.clean import clean, exported
from gpufleet.export.render import REQUIREMENTS, Document, Export, build, gather, to_files, to_yaml

__all__ = ["REQUIREMENTS", "Document", "Export", "build", "clean", "exported", "gather", "to_files", "to_yaml"]
