"""Issue 25's repros ("comparisons a user can trust at a glance"), one test each, as the issue
states them: like-for-like headline, noise flags in every output, every direction, errors that
are the user's, the library version named, output that reads in a notebook export and a pipe."""
from __future__ import annotations

import pytest
import torch

from rawconv import ConvProblem, compare, onednn
from rawconv.errors import ArgumentTypeError, InternalError

pytestmark = pytest.mark.usefixtures("dnnl")


# ---------------------------------------------------------------------------- errors
def test_a_wrong_keyword_is_the_users_type_error_not_an_internal_error():
    """``onednn.Convolution(x, w, direction=...)`` and ``compare.compare(..., direction=...)`` raised
    InternalError ("please report"): a keyword the function does not take is the caller's TypeError."""
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    with pytest.raises(ArgumentTypeError, match="unexpected keyword argument 'direktion'") as ei:
        onednn.Convolution(x, w, direktion="backward_data")
    assert isinstance(ei.value, TypeError) and not isinstance(ei.value, InternalError)
    p = ConvProblem.from_torch(x, w)
    with pytest.raises(ArgumentTypeError, match="unexpected keyword argument 'directon'"):
        compare.compare([p], directon="backward_data", progress=False)
    with pytest.raises(ArgumentTypeError, match="too many positional"):
        compare.compare_problem(p, 3)
    # a TypeError raised inside a function whose arguments fit stays an internal error
    from rawconv import _guard

    @_guard.public
    def f(a):
        raise TypeError("a bug")

    with pytest.raises(InternalError, match="a bug"):
        f(1)
