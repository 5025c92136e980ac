"""The product's job kinds, one module each; every module here registers its kinds on import
(``core.contract.kind.load_kinds`` imports them all; see docs/PLUGINS.md)."""
