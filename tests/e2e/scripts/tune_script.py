"""An unchanged Ray Tune script: a grid of three trials."""

from ray import tune


def objective(config):
    return {"score": config["x"] ** 2}


results = tune.Tuner(objective, param_space={"x": tune.grid_search([1, 2, 3])}).fit()
print("tune-finished", results.get_best_result(metric="score", mode="max").config["x"])
