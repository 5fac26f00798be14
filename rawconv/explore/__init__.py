"""On top of everything: compare, the command line, ``rawconv info``."""
