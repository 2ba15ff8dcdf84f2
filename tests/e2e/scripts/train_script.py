"""An unchanged Ray Train script: two workers, a few reported steps."""

import ray.train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config):
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ray.train.report({"step": step, "loss": float(loss.detach())})


result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)).fit()
print("train-finished", result.error is None)
