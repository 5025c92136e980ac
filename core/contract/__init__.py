"""What a job kind is, in one place: its request fields and their errors (``fields``, ``errors``), the registry
lookups a kind's checks use (``checks``), the kind itself with its fan-out declaration and the kind table
(``kind``), how clients present it (``charts``, ``columns``) and the result it returns (``results``)."""
