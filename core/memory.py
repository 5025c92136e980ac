"""Torch-free estimates of the memory a training request's model needs on a worker, and the budget they must fit.

A training job holds its model's weights, their gradients and Adam's two moments (4 fp32 tensors: 16 bytes per
parameter), and, during a step, the activations the forward pass saves for the backward pass plus the gradients
the backward pass computes from them. The estimates count both from the model's shapes at the request's batch
size, in fp32 (reduced precision needs less; the estimate is then an upper bound). ``validate`` refuses a request
whose estimate exceeds ``EXPLAINQ_WORKER_MEMORY_BYTES`` with a 422 naming the fields that drive it and saying
what it would need, instead of queueing a job that dies allocating it (``embedding_dim 4096, num_filters 1024``
asked ConvE for 131 GB).

``tests/adversarial/test_numbers.py`` checks the parameter counts against the real torch models (exact) and the
activation estimates against the bytes a real training step saves for its backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core import placement
from core.contract.errors import FieldError
from core.settings import Settings
from models.kg.shapes import default_height, expected_shapes

FLOAT_BYTES = 4
# weights, gradients, Adam's first and second moments: four fp32 tensors per parameter
TRAINING_BYTES_PER_PARAMETER = 4 * FLOAT_BYTES


@dataclass(frozen=True)
class Estimate:
    parameters: int
    saved_bytes: int  # what one step's forward pass keeps for the backward pass
    working_bytes: int  # what the backward pass holds besides: the gradients of the activations it works on

    @property
    def parameter_bytes(self) -> int:
        return self.parameters * TRAINING_BYTES_PER_PARAMETER

    @property
    def activation_bytes(self) -> int:
        return self.saved_bytes + self.working_bytes

    @property
    def total_bytes(self) -> int:
        return self.parameter_bytes + self.activation_bytes


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


# -------------------------------------------------------------------------------------------------------- ConvE

# Floats one ConvE query saves for its backward pass, per unit of its sizes (measured with saved-tensor hooks on
# models/kg/conve.py: the conv output, BatchNorm, ReLU and dropout each keep a tensor of the conv features' size;
# the scores and the loss's targets one of the entities' size each; the rest is a few embedding-sized tensors).
CONVE_SAVED_PER_FEATURE = 5
CONVE_SAVED_PER_ENTITY = 2
CONVE_SAVED_PER_DIM = 8
# ConvE is one layer deep: its backward pass computes a gradient for every saved activation, about as much again.


def conve_parameters(num_entities: int, relation_rows: int, dim: int, height: int, filters: int,
                     kernel_size: int = 3) -> int:
    """ConvE's parameter count (``models.kg.conve.ConvE``): its tensors' shapes less the BatchNorm buffers."""
    shapes = expected_shapes(num_entities, relation_rows, dim, height, filters, kernel_size)
    total = 0
    for name, shape in shapes.items():
        if name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            continue
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def conve_features(dim: int, height: int, filters: int, kernel_size: int = 3) -> int:
    """The flattened conv features of one query: filters x (2H - k + 1) x (W - k + 1)."""
    width = dim // height
    return filters * (2 * height - kernel_size + 1) * (width - kernel_size + 1)


def conve_training(num_entities: int, num_relations: int, dim: int, height: int | None, filters: int,
                   batch_size: int, reciprocal: bool = True, kernel_size: int = 3) -> Estimate:
    """Training ConvE (``models.kg.train``) at ``batch_size`` triples per step: one query per triple, two when
    ``reciprocal``."""
    h = height or default_height(dim)
    relation_rows = 2 * num_relations if reciprocal else num_relations
    queries = batch_size * (2 if reciprocal else 1)
    per_query = (CONVE_SAVED_PER_FEATURE * conve_features(dim, h, filters, kernel_size)
                 + CONVE_SAVED_PER_ENTITY * num_entities + CONVE_SAVED_PER_DIM * dim)
    saved = queries * per_query * FLOAT_BYTES
    return Estimate(conve_parameters(num_entities, relation_rows, dim, h, filters, kernel_size), saved, saved)


# --------------------------------------------------------------------------------------------------- Vision-BDH

BDH_IMAGE_SIZE, BDH_PATCH_SIZE, BDH_CHANNELS = 32, 4, 3  # every dataset train/bdh reads is 32x32 RGB
# Floats one application of the BDH layer saves per token (measured with saved-tensor hooks on
# models/vision/bdh.py): about 4 per neuron of every head (x_s, its rotation, y_s, the gated product), 3 per
# embedding dimension of every head (attention output and its LayerNorm), and 2 attention scores per token pair.
BDH_SAVED_PER_NEURON = 4
BDH_SAVED_PER_HEAD_DIM = 3
BDH_SAVED_PER_SCORE = 2


def bdh_tokens(cls_token: bool) -> int:
    return (BDH_IMAGE_SIZE // BDH_PATCH_SIZE) ** 2 + int(cls_token)


def bdh_parameters(n_embd: int, n_head: int, mlp_multiplier: int, cls_token: bool, num_classes: int) -> int:
    """Vision-BDH's parameter count (``models.vision.config.VisionBDHConfig.expected_parameters``): patch conv,
    position embedding, CLS token, the shared E, E_v and Dec (3 x mlp_multiplier x D^2), the head."""
    d = n_embd
    neurons = mlp_multiplier * d // n_head
    return (BDH_CHANNELS * BDH_PATCH_SIZE**2 * d + d + bdh_tokens(cls_token) * d + (d if cls_token else 0)
            + 3 * n_head * d * neurons + d * num_classes + num_classes)


def bdh_training(n_layer: int, n_embd: int, n_head: int, mlp_multiplier: int, cls_token: bool, num_classes: int,
                 batch_size: int) -> Estimate:
    """Training Vision-BDH (``models.vision.train``) at ``batch_size`` images per step: every application of the
    shared layer saves its own activations; the backward pass works on one application at a time."""
    t = bdh_tokens(cls_token)
    tokens = batch_size * t
    per_layer = (tokens * (BDH_SAVED_PER_NEURON * mlp_multiplier * n_embd + BDH_SAVED_PER_HEAD_DIM * n_head * n_embd)
                 + BDH_SAVED_PER_SCORE * n_head * batch_size * t * t) * FLOAT_BYTES
    return Estimate(bdh_parameters(n_embd, n_head, mlp_multiplier, cls_token, num_classes),
                    n_layer * per_layer, 2 * per_layer)


# ------------------------------------------------------------------------------------------------------- budget


def check_budget(settings: Settings, estimate: Estimate, fields: list[tuple[str, Any]], what: str) -> None:
    """A 422 naming ``fields`` (``(dotted name, value)``, the ones that drive the estimate first) when ``estimate`` exceeds
    the memory budget of every worker that could take the request (``core.placement.memory_budget``: its worker
    classes', else ``EXPLAINQ_WORKER_MEMORY_BYTES``; 0 turns the check off). The estimate also places the job."""
    budget = placement.memory_budget(settings, estimate.total_bytes)
    if not budget or estimate.total_bytes <= budget:
        return
    names = ", ".join(name for name, _ in fields)
    source = ("the worker classes that can take it (EXPLAINQ_WORKER_CLASSES)" if placement.worker_classes(settings)
              else "a worker offers (EXPLAINQ_WORKER_MEMORY_BYTES)")
    message = (f"{what} would need about {gib(estimate.total_bytes)} of worker memory ({estimate.parameters:,} "
               f"parameters with their gradients and Adam's moments: {gib(estimate.parameter_bytes)}; activations "
               f"of one step: {gib(estimate.activation_bytes)}), more than the {gib(budget)} {source}; "
               f"lower {names}")
    (first, value), *rest = fields
    raise FieldError(("body", *first.split(".")), message, value=value,
                     related=[(("body", *n.split(".")), v) for n, v in rest])
