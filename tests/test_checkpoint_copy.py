"""``best.ckpt``'s in-memory gather (``last_checkpoint._copied``): a copy that training on cannot change."""

from collections import OrderedDict, namedtuple

import torch

from ct_lightning.experiment.runs.last_checkpoint import _copied

Pair = namedtuple("Pair", "weight step")


def test_the_copy_is_equal_and_shares_no_collection_or_tensor():
    weight = torch.arange(6.0).reshape(2, 3)
    original = {"state_dict": OrderedDict(w=weight), "optimizer_states": [{"state": {0: Pair(weight * 2, 3)}}],
                "loops": ({"epoch": 4},), "hparams_name": "kwargs", "score": None}
    copy = _copied(original)
    assert type(copy["state_dict"]) is OrderedDict and type(copy["loops"]) is tuple
    pair = copy["optimizer_states"][0]["state"][0]
    assert type(pair) is Pair and pair.step == 3 and torch.equal(pair.weight, weight * 2)
    assert torch.equal(copy["state_dict"]["w"], weight) and copy["hparams_name"] == "kwargs" and copy["score"] is None
    # training on: every tensor changed in place and every collection grown
    weight.add_(100)
    original["optimizer_states"][0]["state"][0].weight.zero_()
    original["state_dict"]["extra"] = 1
    original["optimizer_states"].append({})
    original["loops"][0]["epoch"] = 5
    assert torch.equal(copy["state_dict"]["w"], torch.arange(6.0).reshape(2, 3)) and "extra" not in copy["state_dict"]
    assert torch.equal(pair.weight, torch.arange(6.0).reshape(2, 3) * 2)
    assert len(copy["optimizer_states"]) == 1 and copy["loops"][0]["epoch"] == 4


def test_a_copied_tensor_is_detached():
    leaf = torch.ones(3, requires_grad=True)
    copy = _copied({"t": leaf * 2})
    assert not copy["t"].requires_grad and torch.equal(copy["t"], torch.full((3,), 2.0))
