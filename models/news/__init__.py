"""News recommenders (NRMS, NAML), MIND/pairwise/synthetic data, training and checkpoints."""
