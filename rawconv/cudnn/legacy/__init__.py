"""The parts of the legacy API (:mod:`rawconv.cudnn`, the face, hands their names on): :mod:`.common`
(the names they share), :mod:`.plan` (the plan :class:`rawconv.cudnn.Convolution` and
:class:`rawconv.cudnn.ResidualBiasActivation`), its mixins :mod:`.algorithms` (descriptors, the algo
queries, selection) and :mod:`.autotune` (the timed search and its tuning records), :mod:`.hot` (the
plan's prepared call) and :mod:`.functions` (the function forms, plan caches, capabilities). No part
imports the face."""
