"""The shipped corpus as a dataset a Hugging Face Trainer takes: windows of characters as input_ids and labels."""

from __future__ import annotations

from torch.utils.data import Dataset

from ..data import TokenWindows, load_tokens


class CorpusDataset(Dataset):
    """Non-overlapping windows of `seq_len` characters of Tiny Shakespeare, as {"input_ids", "labels"} (labels are
    the inputs: the model shifts them), the same windows scalekit's default batches for a Hugging Face model use."""

    def __init__(self, seq_len: int = 64, split: str = "train"):
        self.windows = TokenWindows(load_tokens(split), seq_len)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict:
        x, _ = self.windows[i]
        return {"input_ids": x, "labels": x}
