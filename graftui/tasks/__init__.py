"""Task kinds, one folder each: ``classification/``, ``completion/``, ``harness/``.

A kind's folder holds its data (reading and batching its examples), its scoring and ``kind.py``, the one object
(``base.TaskKind``) that tells every verb what differs for that kind. ``sources.py`` reads the files and Hub datasets
every kind starts from; ``base.py`` is the registry. This package imports nothing itself: a kind's data module sits
on a lower floor than the kinds (the core imports it), so loading it must not load the kinds. ``graftui.kinds``
imports each built-in kind, which registers it, and answers every question about kinds.
"""
