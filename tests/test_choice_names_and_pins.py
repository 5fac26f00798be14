"""One name per candidate (an ambiguous short name refused with the matches listed; the same name in
compare rows, autotune, selected(), records and plots) and a training step pinned by one
TrainingChoice or a dict per direction, for the operator, the modules and convert's backward search
(issue 34)."""
from __future__ import annotations

import pytest
import torch

from rawconv.errors import ArgumentError, ArgumentTypeError


def _three(x, w, **kw):
    from rawconv import onednn

    pick = {}
    for d in ("forward", "backward_data", "backward_weights"):
        names = [i.choice for i in onednn.implementations(x, w, direction=d, **kw) if not i.name.startswith("ref")]
        pick[d] = names[-1]    # not oneDNN's first choice: a pin that shows
    return pick


def _ran(ops):
    return {p.direction: p.selected.choice for p in ops._cpu_cache._plans.values()}


def test_an_ambiguous_short_name_is_refused_with_the_matches_listed():
    from rawconv import onednn

    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    impls = onednn.implementations(x, w, padding=1)
    refs = [i for i in impls if i.name == "ref:any"]
    if len({i.layouts for i in refs}) < 2:
        pytest.skip("this oneDNN lists ref:any with one layouts here")
    with pytest.raises(ArgumentError) as exc:
        onednn.forward(x, w, padding=1, impl="ref:any")
    for i in refs:
        assert f"{i.choice} [{i.index}]" in str(exc.value)
    import rawconv.ops as ops

    with pytest.raises(ArgumentError, match="ambiguous"):
        ops.conv(x, w, padding=1, choice="ref:any")
    # the canonical name and an unambiguous short name are accepted, and mean the same row
    conv = onednn.Convolution(x, w, padding=1)
    assert conv.select("ref:any@user").choice == "ref:any@user"
    other = next(i for i in impls if sum(j.name == i.name for j in impls) == 1)
    assert conv.select(other.name).choice == conv.select(other.choice).choice == other.choice


def test_one_name_in_compare_rows_autotune_selected_records_and_plots():
    from rawconv import compare, onednn
    import rawconv.ops as ops
    from rawconv.problem import ConvProblem

    p = ConvProblem(n=1, c=4, k=4, in_spatial=(6, 6), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1), name="t")
    rows = compare.compare([p], iterations=1, warmup=0, budget_s=2.0, include_ref=False, progress=False,
                           confirm_rounds=1)
    offered = {i.choice: i for i in onednn.Convolution.from_problem(p).implementations}
    for r in rows:
        if r.backend == "onednn":
            assert r.choice in offered and r.implementation == r.choice + (
                " (prepacked)" if r.extra.get("weights") == "prepacked" else "")
            assert r.extra["vendor_name"] == offered[r.choice].name     # oneDNN's own name stays visible
    recs = compare.records(rows, [p])
    assert recs and recs[0].choice in offered
    x, w, _ = p.make_inputs()
    table = onednn.Convolution(x, w, padding=1).autotune(iterations=1, warmup=0)
    assert all(r.name == r.impl.choice for r in table)
    assert set(ops.selected(x, w, padding=1).values()) <= {i.choice for d in ("forward", "backward_data",
                                                                             "backward_weights")
                                                           for i in onednn.implementations(x, w, padding=1,
                                                                                           direction=d)}
    from rawconv.explore.render import _heatmap_key, _label

    for r in rows:
        if r.backend == "onednn":
            assert _label(r, {"onednn"}) == _heatmap_key(r) == r.name


@pytest.mark.parametrize("as_object", [True, False])
def test_one_choice_pins_the_whole_training_step(as_object):
    import rawconv.nn as rnn
    import rawconv.ops as ops

    x = torch.randn(2, 8, 10, 10)
    conv = torch.nn.Conv2d(8, 8, 3, padding=1)
    w = conv.weight.detach()
    pick = _three(x, w, padding=1)
    step = ops.TrainingChoice(**pick) if as_object else dict(pick)
    assert ops.selected(x, w, padding=1, choice=step) == pick
    # the operator
    ops.clear_cache()
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    ops.conv(xx, ww, padding=1, choice=step).sum().backward()
    assert _ran(ops) == pick
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.nn.functional.conv2d(x2, w2, padding=1).sum().backward()
    torch.testing.assert_close(ww.grad, w2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xx.grad, x2.grad, rtol=1e-4, atol=1e-4)
    # the module: every call runs exactly those three
    ops.clear_cache()
    m = rnn.Conv2d(8, 8, 3, padding=1, choice=step)
    m.load_state_dict(conv.state_dict())
    assert m.choice == pick["forward"] and m.backward_choice == (pick["backward_data"], pick["backward_weights"])
    m(x.clone().requires_grad_()).sum().backward()
    assert _ran(ops) == pick
    ref = conv(x).sum()
    ref.backward()
    torch.testing.assert_close(m.weight.grad, conv.weight.grad, rtol=1e-4, atol=1e-4)
    # both places pinning the backward passes is refused; an unknown direction too
    with pytest.raises(ArgumentError, match="training step"):
        ops.conv(x, w, padding=1, choice=step, backward_choice="x64:gemm:jit@any")
    with pytest.raises(ArgumentError, match="unknown direction"):
        rnn.Conv2d(8, 8, 3, choice={"fwd": "x"})
    with pytest.raises(ArgumentTypeError):
        ops.TrainingChoice.of(3)


def test_pin_choices_and_a_transposed_module_take_library_directions():
    import rawconv.nn as rnn
    import rawconv.ops as ops

    a, b, c = "x64:gemm:jit@any", "jit:avx2@any", "jit:sse41@any"
    m = rnn.ConvTranspose2d(4, 4, 3, choice={"forward": a, "backward_data": b, "backward_weights": c})
    # a transposed convolution runs its matching convolution's backward data; its input gradient the forward
    assert m.choice == b and m.backward_choice == (a, c)
    model = rnn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)))
    rnn.pin_choices(model, {"0": ops.TrainingChoice(a, None, c)})
    assert model[0].choice == a and model[0].backward_choice == (None, c)


def test_convert_backward_search_pins_and_reports_all_three():
    import rawconv.nn as rnn
    import rawconv.ops as ops

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1))
    x = torch.randn(2, 3, 12, 12)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = rnn.convert(net, autotune=x, autotune_backward=True, autotune_budget_s=0.05)
    pinned = rnn.pinned_choices(model)
    for name in ("0", "2"):
        dirs = pinned[name]["tuned"][0]["directions"]
        assert set(dirs) == {"forward", "backward_data", "backward_weights"} and all(dirs.values())
        assert pinned[name]["backward_choice"] == (dirs["backward_data"], dirs["backward_weights"])
    # the training step runs what was pinned, in every direction
    ops.clear_cache()
    model[2](torch.randn(2, 8, 12, 12, requires_grad=True)).sum().backward()
    assert _ran(ops) == pinned["2"]["tuned"][0]["directions"]
    table = rnn.describe(model, x, iterations=1)
    d2 = pinned["2"]["tuned"][0]["directions"]
    assert table[1].backward == (f"backward_data {d2['backward_data']}, backward_weights {d2['backward_weights']} "
                                 "(pinned)")
    assert "autotuned: forward" in table[1].note


def test_convert_refuses_choice_keys_that_are_no_conv_module():
    # breaker D3: a training step's dict (what rawconv.ops.selected returns) or a misspelt module name
    # as convert's choice dict pinned nothing, silently
    import rawconv.nn
    from rawconv import ops

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    step = ops.selected(x, model[0].weight, padding=1)
    assert set(step) == {"forward", "backward_data", "backward_weights"}
    with pytest.raises(ArgumentError, match="training step's directions.*TrainingChoice"):
        rawconv.nn.convert(model, choice=dict(step))
    with pytest.raises(ArgumentError, match=r"not convolution modules of this model: \['O'\].*\['0', '2'\]"):
        rawconv.nn.convert(model, choice={"O": step["forward"]})
    with pytest.raises(ArgumentError, match="not convolution modules"):
        rawconv.nn.convert(model, choice={"0": None, "1": step["forward"]})   # "1" is the ReLU
    # what convert takes pins what it says
    m = rawconv.nn.convert(model, choice={"0": dict(step)})
    pins = rawconv.nn.pinned_choices(m)
    assert pins["0"]["choice"] == step["forward"] and pins["2"]["choice"] is None
    assert pins["0"]["backward_choice"] == (step["backward_data"], step["backward_weights"])
    m = rawconv.nn.convert(model, choice=ops.TrainingChoice(**step))
    assert all(p["choice"] == step["forward"] for p in rawconv.nn.pinned_choices(m).values())


def test_pin_choices_replaces_backward_pins_checks_types_and_is_atomic():
    # breaker D4: a forward-only pin or None left an earlier step's backward pins in place; ints and
    # other objects were accepted until the next forward; a bad entry raised after earlier ones
    # were pinned
    import rawconv.nn
    from rawconv.errors import ArgumentTypeError

    m = rawconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1),
                                               torch.nn.Conv2d(16, 16, 3, padding=1)))
    x = torch.randn(1, 8, 6, 6)
    step = _three(x, m[0].weight, padding=1)
    rawconv.nn.pin_choices(m, {"0": step})
    assert m[0].backward_choice == (step["backward_data"], step["backward_weights"])
    rawconv.nn.pin_choices(m, {"0": step["forward"]})
    assert (m[0].choice, m[0].backward_choice) == (step["forward"], None)
    rawconv.nn.pin_choices(m, {"0": step})
    rawconv.nn.pin_choices(m, {"0": None})
    assert (m[0].choice, m[0].backward_choice) == (None, None)
    assert rawconv.nn.pinned_choices(m)["0"]["backward_choice"] is None
    for bad in (3, object(), 2.5):
        with pytest.raises(ArgumentTypeError, match=r"choices\['0'\]"):
            rawconv.nn.pin_choices(m, {"0": bad})
    assert m[0].choice is None
    # atomic: nothing pinned when any entry is bad (a later type error, a step with an unknown key)
    for bad in ({"1": 3}, {"1": {"fwd": step["forward"]}}):
        with pytest.raises((ArgumentError, ArgumentTypeError)):
            rawconv.nn.pin_choices(m, {"0": step["forward"], **bad})
        assert m[0].choice is None and m[1].choice is None
    # and the model runs: forward with the pin, backward on the defaults again
    rawconv.nn.pin_choices(m, {"0": step})
    rawconv.nn.pin_choices(m, {"0": step["forward"]})
    xg = x.clone().requires_grad_()
    m(xg).sum().backward()
    ref = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 3, padding=1))
    ref.load_state_dict(m.state_dict())
    xr = x.clone().requires_grad_()
    ref(xr).sum().backward()
    assert torch.allclose(xg.grad, xr.grad, atol=1e-4)


def test_a_step_set_as_the_choice_attribute_is_refused_naming_training_choice():
    # breaker D8: module.choice = TrainingChoice(...) failed at the next forward with an error that
    # never named TrainingChoice nor where a step goes
    import rawconv.nn
    from rawconv import ops
    from rawconv.errors import ArgumentTypeError

    m = rawconv.nn.Conv2d(8, 16, 3, padding=1)
    x = torch.randn(2, 8, 10, 10)
    step = ops.selected(x, m.weight, padding=1)
    for bad in (ops.TrainingChoice(**step), dict(step)):
        m.choice = bad
        with pytest.raises(ArgumentTypeError, match=r"training step \(rawconv.ops.TrainingChoice.*pin_choices"):
            m(x)
    m.choice, m.backward_choice = step["forward"], (step["backward_data"], step["backward_weights"])
    assert torch.allclose(m(x), torch.nn.functional.conv2d(x, m.weight, m.bias, padding=1), atol=1e-4)
