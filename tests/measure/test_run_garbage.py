"""A run frees its model at its end even when the model sits in a reference cycle, and collects only what it
created (measure/garbage.py): the process's older objects are frozen for the run and handed back after it."""

import gc
import weakref

import pytest
import torch

from scalekit import GenerateConfig, RunConfig, generate, run
from scalekit.measure.garbage import only_new_objects_collected
from tests.helpers import CPU


class CycleLM(torch.nn.Module):
    """A user's model that holds itself through a hook's closure, as wrappers and hooks often do."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(65, 16)
        self.head = torch.nn.Linear(16, 65)
        self.register_forward_hook(lambda module, args, out: out if module is self else out)

    def forward(self, idx):
        return self.head(self.emb(idx))


@pytest.fixture
def no_automatic_collection():
    """Only the run's own collection may free the cycle (an automatic one could free it by chance)."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_a_model_in_a_reference_cycle_is_freed_when_the_run_ends(no_automatic_collection):
    built = []

    def factory():
        model = CycleLM()
        built.append(weakref.ref(model))
        return model

    def batch(batch_size, device):
        xy = torch.randint(0, 65, (batch_size, 9), device=device)
        return xy[:, :-1], xy[:, 1:]

    def loss(model, b):
        return torch.nn.functional.cross_entropy(model(b[0]).flatten(0, 1), b[1].flatten())

    result = run(RunConfig(model=factory, batch_fn=batch, loss_fn=loss, tokens_per_sample=8, batch_size=2,
                           steps=2, warmup_steps=0, device="cpu", measure_memory=False, check_memory=False), hw=CPU)
    assert result.status == "ok", result.error
    assert built and built[0]() is None, "the run ended with its model still alive"
    assert gc.get_freeze_count() == 0  # what was frozen for the run is handed back


def test_a_run_that_fails_in_a_step_frees_its_model_too(no_automatic_collection):
    built, calls = [], []

    def factory():
        model = CycleLM()
        built.append(weakref.ref(model))
        return model

    def broken_loss(model, b):  # counts its FLOPs once, then breaks in the first step
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("the user's loss is broken")
        return model(b).sum()

    result = run(RunConfig(model=factory, batch_fn=lambda n, d: torch.zeros(n, 8, dtype=torch.long),
                           loss_fn=broken_loss, batch_size=2, steps=1, warmup_steps=0, device="cpu",
                           measure_memory=False, check_memory=False), hw=CPU, catch_errors=True)
    assert result.status == "failed" and "broken" in result.error
    assert built[0]() is None
    assert gc.get_freeze_count() == 0


def test_a_generation_frees_its_model(no_automatic_collection):
    model = CycleLM()
    ref = weakref.ref(model)

    result = generate(GenerateConfig(model=model, prompts=[[1, 2, 3]], max_new_tokens=2, device="cpu",
                                     warmup_tokens=0, measure_memory=False, quality=False), hw=CPU)
    assert result.status == "ok", result.error
    del model
    gc.collect()
    assert ref() is None
    assert gc.get_freeze_count() == 0


def test_garbage_from_before_the_run_is_still_collected_after_it(no_automatic_collection):
    class Node:
        pass

    old = Node()
    old.me = old  # a cycle made before the run: frozen during it, collectable after it
    ref = weakref.ref(old)
    del old
    with only_new_objects_collected():
        gc.collect()
        assert ref() is not None  # frozen: the run's collection does not visit it
    gc.collect()
    assert ref() is None


def test_objects_someone_else_froze_stay_frozen(no_automatic_collection):
    """Checked on objects, not on `gc.get_freeze_count()`: frozen objects freed by their reference count (another
    thread's temporaries) leave the permanent generation at any time, so the count may drop by itself."""
    class Node:
        pass

    theirs = Node()
    theirs.me = theirs  # a cycle someone froze before the block
    their_ref = weakref.ref(theirs)
    del theirs
    gc.freeze()
    try:
        later = Node()
        later.me = later  # made after their freeze: the block must not freeze it (nor keep it frozen)
        later_ref = weakref.ref(later)
        del later
        with only_new_objects_collected():
            pass
        assert gc.get_freeze_count() > 0, "the block unfroze what someone else froze"
        gc.collect()
        assert their_ref() is not None, "the block handed someone else's frozen objects back to the collector"
        assert later_ref() is None, "the block froze objects of its own although someone else had frozen first"
    finally:
        gc.unfreeze()
    gc.collect()
    assert their_ref() is None
