"""The web dashboard served at ``/ui`` (see ``app.ui.router``)."""
