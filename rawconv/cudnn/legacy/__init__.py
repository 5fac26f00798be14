"""The parts of the legacy API's plan (:class:`rawconv.cudnn.Convolution`, whose face and function
forms are :mod:`rawconv.cudnn`): :mod:`.algorithms` (descriptors, the algo queries, selection) and
:mod:`.autotune` (the timed search and its tuning records). Mixins, read by the plan class only."""
