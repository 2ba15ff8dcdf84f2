"""An unchanged Ray Serve HTTP app: deployed, left running, reached over HTTP by whoever knows its route."""

from ray import serve


@serve.deployment
class Greeter:
    async def __call__(self, request) -> dict:  # type: ignore[no-untyped-def]
        return {"greeting": f"hello {request.query_params.get('name', 'world')}"}


serve.run(Greeter.bind(), name="greeter", route_prefix="/greeter")
print("greeter-deployed")
