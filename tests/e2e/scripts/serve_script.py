"""An unchanged Ray Serve script: deploy, call through a handle, shut down."""

from ray import serve


@serve.deployment
class Doubler:
    def __call__(self, value: int) -> int:
        return value * 2


handle = serve.run(Doubler.bind())
print("serve-finished", handle.remote(21).result())
serve.shutdown()
