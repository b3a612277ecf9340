"""Unit tests run on tiny models: one intra-op thread avoids oversubscribing 2-core CI."""

import torch

torch.set_num_threads(1)
