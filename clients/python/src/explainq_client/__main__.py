"""``python -m explainq_client``: the ``explainq-client`` command line."""

from explainq_client.cli import main

main()
