"""The model families: one folder per family (``<family>/spec.py``, torch-free: names, options and their rules,
FLOPs, bytes, parameters, decode state, the row extras and columns it writes, its role in the article's claims; and
``<family>/layers.py``, torch: the modules and the ``TorchFamily`` that builds, probes and describes them), beside
the scaffolding they share and the loops over them. Nothing outside this room needs to know which family a case
belongs to: it asks the family (``catalogue.family_of``).

Torch-free here: ``base``, ``shared``, ``recurrent``, ``catalogue``, ``flops``, ``traffic``, ``state_bytes``,
``extras``, ``plugins`` and every ``spec`` (a test holds them so). Torch: ``torch_family``, ``states``, ``blocks``,
``positional``, ``registry``, ``serving`` and every ``layers``. Imports ``core`` only."""
