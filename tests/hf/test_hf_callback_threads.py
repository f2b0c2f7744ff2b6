"""ScalekitCallback pins torch's threads for the Trainer's run as scalekit.run does, and puts them back."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the Transformers bridge needs transformers installed")

from scalekit import ConfigError  # noqa: E402
from scalekit.hf import CorpusDataset, causal_lm  # noqa: E402


def callback(**kwargs):
    from scalekit.hf import ScalekitCallback  # at run time: see tests/hf/test_hf_callback.py

    return ScalekitCallback(**kwargs)


def trainer_run(tmp_path, cb, steps=3):
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=steps, logging_steps=1, use_cpu=True,
        report_to="none", save_strategy="no", disable_tqdm=True, optim="adamw_torch")
    seen = []

    class Threads(transformers.TrainerCallback):  # what torch was set to while each step ran
        def on_step_end(self, *args, **kwargs):
            seen.append(torch.get_num_threads())

    trainer = transformers.Trainer(model=causal_lm("gpt2", "tiny").build(), args=arguments,
                                   train_dataset=CorpusDataset(16), callbacks=[cb, Threads()])
    trainer.train()
    return seen


def test_threads_are_pinned_for_the_run_recorded_and_restored(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cb = callback(warmup_steps=1, threads=1)
        seen = trainer_run(tmp_path, cb)
        assert seen == [1, 1, 1]  # every step on the threads asked for
        assert cb.result.threads == 1
        assert cb.result.load is not None  # the machine's load during the run, as scalekit.run records it
        assert torch.get_num_threads() == 2  # put back when the Trainer ended
    finally:
        torch.set_num_threads(before)


def test_by_default_the_run_gets_what_scalekit_run_would(tmp_path):
    # the cores not already busy (measure.load.auto_threads, which moves with the machine's load), never more
    # than torch was set to; the same for every step of the run
    cb = callback(warmup_steps=1)
    before = torch.get_num_threads()
    seen = trainer_run(tmp_path, cb, steps=2)
    assert len(set(seen)) == 1 and 1 <= seen[0] <= before
    assert cb.result.threads == seen[0]
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_thread_count_names_the_field(bad):
    with pytest.raises(ConfigError, match="ScalekitCallback.threads"):
        callback(threads=bad)
