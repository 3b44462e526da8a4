"""`gpufleet simulate`: replay a GPU-cluster trace through the real control plane in virtual time."""
