"""The OpenAI-compatible routes in-process, on the tiny model (no Ray cluster: the replica is built here and handed
to the routes the way Serve hands them its replica): answers, streams and every client mistake's error."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from raypod.serving import catalog, loader


@pytest.fixture(scope="module")
def client(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    pytest.importorskip("ray.serve", reason="needs Ray Serve: pip install -e '.[serving]'")
    from ray import serve

    from raypod.serving import openai_app

    patch = pytest.MonkeyPatch()
    patch.setenv(loader.CACHE_VARIABLE, str(tmp_path_factory.mktemp("cache")))
    entry = catalog.inspect(catalog.ModelSource(id="tiny", source=str(tiny_model)))
    replica = openai_app.OpenAIServer({"entry": entry.model_dump(mode="json"), "kv_cache": True})
    patch.setattr(serve, "get_replica_context", lambda: types.SimpleNamespace(servable_object=replica))
    with TestClient(openai_app.app, raise_server_exceptions=False) as test_client:
        yield test_client
    patch.undo()


def events(response: object) -> list[str]:
    text = response.text  # type: ignore[attr-defined]
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_completions_and_chat_answer_in_openais_shapes(client: TestClient) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    body = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "the fox", "max_tokens": 5, "temperature": 0}
    )
    assert body.status_code == 200, body.text
    answer = body.json()
    assert answer["object"] == "text_completion" and answer["choices"][0]["finish_reason"] in ("length", "stop")
    assert answer["usage"]["prompt_tokens"] > 0 and answer["raypod"]["replica"] == "local"
    chat = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0},
    ).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"


def test_streams_are_server_sent_events_ending_in_done(client: TestClient) -> None:
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    streamed = client.post("/v1/chat/completions", json=request)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    data = events(streamed)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and "raypod" in chunks[0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    whole = client.post("/v1/chat/completions", json={**request, "stream": False}).json()
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/completions", {"model": "tiny", "prompt": "fox " * 2000}, 400, "context_length_exceeded"),
        ("/v1/completions", {"model": "other", "prompt": "hi"}, 404, "model_not_found"),
        ("/v1/completions", {"model": "tiny", "prompt": [1, 2, 10**9]}, 400, "invalid_prompt"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "n": 2}, 400, None),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "temperature": 9}, 400, None),
        ("/v1/completions", {"prompt": "hi"}, 400, None),
        ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, None),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, None),
    ],
)
def test_client_mistakes_get_openai_errors(
    client: TestClient, path: str, body: dict[str, object], status: int, code: str | None
) -> None:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error" and error["code"] == code


def test_a_body_that_is_not_json_is_a_400(client: TestClient) -> None:
    response = client.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
