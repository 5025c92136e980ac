"""Hugging Face checkpoints brought by tenants: inspected without torch (``files``), loaded without running any of
their code (``checkpoint``), explained by the model-agnostic engine (``attribution``)."""
