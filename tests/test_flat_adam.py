"""FlatAdam (training.flat_adam) is torch.optim.Adam: the same weights step after step, the same state dictionary
in both directions, Adam's own step wherever the flat one does not apply, and the step hooks run once."""

import pytest
import torch
from torch import nn

from ct_lightning.training.flat_adam import FlatAdam

# Within float32 rounding: the same arithmetic per element (bit for bit on the CPUs we tried), but tests must pass on
# any x86 CPU, whose kernels may round an element differently by its place in a tensor.
CLOSE = {"rtol": 1e-5, "atol": 1e-7}


def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 17), nn.Tanh(), nn.Linear(17, 3), nn.Linear(3, 2, bias=False)).to(dtype)


def _random_grads(model, generator, scale_range=(-9, 2)):
    """Gradients of very different sizes, as training gives (some tiny, some large, some near Adam's eps)."""
    grads = []
    for p in model.parameters():
        scale = 10.0 ** torch.randint(*scale_range, (1,), generator=generator).item()
        grads.append(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
    return grads


def _steps(models_and_optimisers, n, seed=1, lr_change_at=None, method="step"):
    generator = torch.Generator().manual_seed(seed)
    reference = models_and_optimisers[0][0]
    for i in range(n):
        grads = _random_grads(reference, generator)
        if i == lr_change_at:
            for _, optimiser in models_and_optimisers:
                optimiser.param_groups[0]["lr"] *= 0.3  # as a learning-rate scheduler does
        for model, optimiser in models_and_optimisers:
            optimiser.zero_grad()
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            getattr(optimiser, method if isinstance(optimiser, FlatAdam) else "step")()


def _assert_same_weights(a, b):
    """The same weights, compared by their displacement from the common start (the start's size would hide a
    wrong step)."""
    for p, q, start in zip(a.parameters(), b.parameters(), _model(dtype=next(a.parameters()).dtype).parameters()):
        torch.testing.assert_close(p.detach() - start.detach(), q.detach() - start.detach(), **CLOSE)


def _flat(model) -> bool:
    """Whether the model's parameters are views of one buffer (the flat step ran)."""
    return len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flat_steps_give_adams_weights(dtype):
    adam_model, flat_model = _model(dtype=dtype), _model(dtype=dtype)
    adam = torch.optim.Adam(adam_model.parameters(), lr=0.01)
    flat = FlatAdam(flat_model.parameters(), lr=0.01)
    _steps([(adam_model, adam), (flat_model, flat)], 300, lr_change_at=150)
    assert _flat(flat_model) and not _flat(adam_model)
    _assert_same_weights(adam_model, flat_model)
    for p in flat_model.parameters():
        state, reference = flat.state[p], adam.state[next(q for q in adam_model.parameters() if q.shape == p.shape)]
        assert float(state["step"]) == float(reference["step"]) == 300.0


def test_state_dictionaries_resume_in_both_directions():
    """A checkpoint of either optimiser resumes the other one (Lightning saves and loads Adam's state dict)."""
    first, second = _model(), _model()
    adam = torch.optim.Adam(first.parameters(), lr=0.02)
    flat = FlatAdam(second.parameters(), lr=0.02)
    _steps([(first, adam), (second, flat)], 40)
    # Cross over: each model continues under the other optimiser class, from the other's saved state.
    resumed_flat = FlatAdam(first.parameters(), lr=0.02)
    resumed_flat.load_state_dict(adam.state_dict())
    resumed_adam = torch.optim.Adam(second.parameters(), lr=0.02)
    resumed_adam.load_state_dict(flat.state_dict())
    _steps([(first, resumed_flat), (second, resumed_adam)], 40, seed=2)
    _assert_same_weights(first, second)
    assert _flat(first)
    # And a FlatAdam resumed from its own state matches one that never stopped.
    third, fourth = _model(), _model()
    running = FlatAdam(third.parameters(), lr=0.02)
    stopped = FlatAdam(fourth.parameters(), lr=0.02)
    _steps([(third, running), (fourth, stopped)], 25)
    saved = stopped.state_dict()
    again = FlatAdam(fourth.parameters(), lr=0.02)
    again.load_state_dict(saved)
    _steps([(third, running), (fourth, again)], 25, seed=3)
    _assert_same_weights(third, fourth)


@pytest.mark.parametrize("options", [{"weight_decay": 0.01}, {"amsgrad": True}, {"maximize": True}],
                         ids=["weight_decay", "amsgrad", "maximize"])
def test_other_options_take_adams_own_step(options):
    adam_model, flat_model = _model(), _model()
    adam = torch.optim.Adam(adam_model.parameters(), lr=0.01, **options)
    flat = FlatAdam(flat_model.parameters(), lr=0.01, **options)
    _steps([(adam_model, adam), (flat_model, flat)], 50)
    assert not _flat(flat_model)
    _assert_same_weights(adam_model, flat_model)


def test_a_parameter_without_gradient_is_left_alone_as_adam_does():
    adam_model, flat_model = _model(), _model()
    adam = torch.optim.Adam(adam_model.parameters(), lr=0.05)
    flat = FlatAdam(flat_model.parameters(), lr=0.05)
    _steps([(adam_model, adam), (flat_model, flat)], 10)
    frozen = [list(m.parameters())[1] for m in (adam_model, flat_model)]
    before = frozen[1].detach().clone()
    generator = torch.Generator().manual_seed(5)
    for _ in range(5):  # the second parameter gets no gradient: Adam neither moves it nor counts its step
        grads = _random_grads(adam_model, generator)
        for model, optimiser in ((adam_model, adam), (flat_model, flat)):
            optimiser.zero_grad()
            for i, (p, g) in enumerate(zip(model.parameters(), grads)):
                p.grad = None if i == 1 else g.clone()
            optimiser.step()
    assert torch.equal(frozen[1].detach(), before)
    _steps([(adam_model, adam), (flat_model, flat)], 10, seed=6)  # back to the flat step, counts differing
    _assert_same_weights(adam_model, flat_model)
    assert float(flat.state[frozen[1]]["step"]) == float(adam.state[frozen[0]]["step"]) == 20.0


def test_gradients_written_into_the_views_are_the_ones_stepped():
    adam_model, flat_model = _model(), _model()
    adam = torch.optim.Adam(adam_model.parameters(), lr=0.01)
    flat = FlatAdam(flat_model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(7)
    for _ in range(20):
        grads = _random_grads(adam_model, generator)
        views = flat.gradient_views()
        for p, g in zip(flat_model.parameters(), grads):
            assert p.grad is views[p]
            views[p].copy_(g)
        for p, g in zip(adam_model.parameters(), grads):
            p.grad = g.clone()
        flat.step()
        adam.step()
    _assert_same_weights(adam_model, flat_model)
    # A model moved to new tensors (here: to float64 and back) is followed, not stepped in stale buffers.
    flat_model.double().float()
    adam_model.double().float()
    _steps([(adam_model, adam), (flat_model, flat)], 10, seed=8)
    _assert_same_weights(adam_model, flat_model)
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    assert FlatAdam(mixed.parameters()).gradient_views() is None  # one dtype per flat buffer: Adam's own step


def test_step_hooks_run_once_per_step_on_both_paths():
    torch.optim.Adam(nn.Linear(1, 1).parameters())  # once an Adam exists, torch wraps Adam.step in its hook runner
    calls = []
    for options in ({}, {"weight_decay": 0.1}):
        model = _model()
        flat = FlatAdam(model.parameters(), lr=0.01, **options)
        flat.register_step_pre_hook(lambda *args: calls.append("pre"))
        flat.register_step_post_hook(lambda *args: calls.append("post"))
        _steps([(model, flat)], 3)
    assert calls == ["pre", "post"] * 6


def test_the_unlabelled_step_is_the_step_and_still_runs_hooks():
    adam_model, flat_model = _model(), _model()
    adam = torch.optim.Adam(adam_model.parameters(), lr=0.01)
    flat = FlatAdam(flat_model.parameters(), lr=0.01)
    _steps([(adam_model, adam), (flat_model, flat)], 30, method="step_unlabelled")  # CTModule's direct loop's
    _assert_same_weights(adam_model, flat_model)
    calls = []
    handle = flat.register_step_pre_hook(lambda *args: calls.append("pre"))
    _steps([(flat_model, flat)], 2, method="step_unlabelled")
    handle.remove()
    _steps([(flat_model, flat)], 2, method="step_unlabelled")
    assert calls == ["pre", "pre"]


def test_the_unlabelled_step_calls_a_step_replaced_on_the_optimiser():
    model = _model()
    flat = FlatAdam(model.parameters(), lr=0.01)
    step, calls = flat.step, []
    flat.step = lambda *args: (calls.append(1), step(*args))[1]  # as a callback wrapping optimizer.step does
    _steps([(model, flat)], 3, method="step_unlabelled")
    assert calls == [1, 1, 1]


def test_without_torchs_private_hook_names_the_unlabelled_step_takes_the_wrapped_step(monkeypatch):
    """``step_unlabelled`` reads torch's private profiler flag and hook lists to skip the wrapper; a torch without
    one of them (a later release) must still step, through the wrapper, with Adam's weights."""
    adam_model, flat_model = _model(), _model()
    adam = torch.optim.Adam(adam_model.parameters(), lr=0.01)
    flat = FlatAdam(flat_model.parameters(), lr=0.01)
    monkeypatch.delattr(torch.autograd.profiler, "_is_profiler_enabled")
    step, calls = type(flat).step, []
    monkeypatch.setattr(type(flat), "step", lambda self, *args: (calls.append(1), step(self, *args))[1])
    _steps([(adam_model, adam), (flat_model, flat)], 3, method="step_unlabelled")
    assert calls == [1, 1, 1]
    _assert_same_weights(adam_model, flat_model)
