"""Vision-BDH: model (reference and optimised), image data, trainer and checkpoints."""
