"""Traffic shaping in front of the backends: single-flight coalescing, admission queues, embedding batches."""
from .admission import BACKGROUND, LATENCY_CRITICAL, NORMAL, AdmissionController, Place, Superseded
from .coalesce import Coalescer
from .embed_batcher import EmbedBatcher

__all__ = ["AdmissionController", "Place", "Superseded", "LATENCY_CRITICAL", "NORMAL", "BACKGROUND", "Coalescer",
           "EmbedBatcher"]
