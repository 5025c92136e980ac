"""An example explainq plugin: a job kind that trains a small MLP on scikit-learn's digits.

``kind.py`` is what the API and the workers share (torch-free); ``job.py`` runs on the workers. Load it with
``EXPLAINQ_KIND_PLUGINS=explainq_digits.kind:register`` and this directory on ``PYTHONPATH`` (README.md).
"""
