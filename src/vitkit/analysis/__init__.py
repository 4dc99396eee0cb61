"""Inspecting a Vision Transformer (section 4.5): attention maps, attention rollout, mean attention
distance, position-embedding (or rotary-phase) similarity, patch-filter principal components, figures and a
report; the dense patch features of any image size, and an image-text model's text-conditioned maps."""

from .attention import (attention_maps, attention_rollout, capture_attention, mean_attention_distance,
                        output_readout, patch_distances, probe_attention, readout_weights, rollout, rollout_matrix)
from .embeddings import filter_components, patch_filters, position_similarity, position_table, rope_phases
from .features import feature_colours, patch_embeddings, patch_features, text_similarity

__all__ = ["attention_maps", "attention_rollout", "capture_attention", "mean_attention_distance", "output_readout",
           "patch_distances", "probe_attention", "readout_weights", "rollout", "rollout_matrix", "filter_components",
           "patch_filters", "position_similarity", "position_table", "rope_phases", "feature_colours", "patch_embeddings",
           "patch_features", "text_similarity"]
