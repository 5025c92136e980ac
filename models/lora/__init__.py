"""LoRA weight-space ablation: datasets of adapters, per-layer representations and MLP probes.

``models.lora.keys`` is pure Python (no torch) so the API process can validate requests with it; every other
module here needs torch.
"""
