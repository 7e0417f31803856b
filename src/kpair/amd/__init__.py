"""AMD GPU pieces that need no GPU: code objects (``codeobject``), the target-ID rules
(``target``), the assembly round trip (``asm``) and AQL dispatch packets (``aql``).

Nothing here imports hip-python; the ``hip`` backend (``kpair.backends.hip``) builds on it.
"""
