"""The control plane: persisted desired state, a pure planner, an executor, and the loop that ties them."""

__all__: list[str] = []
