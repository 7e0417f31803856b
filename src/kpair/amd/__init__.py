"""AMD GPU pieces that need no GPU: code objects (``codeobject``), the target-ID rules
(``target``) and the assembly round trip (``asm``).

Nothing here imports hip-python; the ``hip`` backend (``kpair.backends.hip``) builds on it.
"""
