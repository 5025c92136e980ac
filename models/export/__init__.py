"""Classifiers brought as ``torch.export`` programs: checked as data (:mod:`models.export.files`,
:mod:`models.export.spec`), run by the service's own interpreter (:mod:`models.export.program`) and explained by
the shared engine (:mod:`models.export.attribution`)."""
