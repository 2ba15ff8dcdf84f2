"""Catalog entries read from a real model directory, and staging onto a node cache: reuse, resume, corruption."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raypod.serving import catalog, loader


@pytest.fixture()
def model_copy(tiny_model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model, tmp_path / "source"))


def entry_of(path: Path, model_id: str = "llama-tiny") -> catalog.ModelEntry:
    return catalog.inspect(catalog.ModelSource(id=model_id, source=str(path)))


def test_an_entry_knows_its_files_parameters_and_needs(model_copy: Path) -> None:
    import json

    from safetensors import safe_open

    progress: list[tuple[int, int]] = []
    entry = catalog.inspect(
        catalog.ModelSource(id="llama-tiny", source=str(model_copy)), progress=lambda d, t: progress.append((d, t))
    )
    with safe_open(str(model_copy / "model.safetensors"), "pt") as weights:
        expected = sum(weights.get_tensor(name).numel() for name in weights.keys())  # noqa: SIM118
    config = json.loads((model_copy / "config.json").read_text())
    assert entry.parameters == expected and entry.dtype == "float32" and entry.architecture == "LlamaForCausalLM"
    assert entry.max_context == config["max_position_embeddings"]
    assert entry.kv_bytes_per_token == 2 * config["num_hidden_layers"] * config["hidden_size"] * 4
    assert {f.path for f in entry.files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert entry.size_bytes == sum(p.stat().st_size for p in model_copy.iterdir() if p.is_file())
    assert entry.memory_bytes > expected * 4
    assert progress[-1] == (entry.size_bytes, entry.size_bytes)


def test_bad_sources_and_ids_get_clear_errors(tmp_path: Path, model_copy: Path) -> None:
    with pytest.raises(catalog.CatalogError, match="does not exist"):
        entry_of(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(catalog.CatalogError, match=r"no config\.json"):
        entry_of(tmp_path / "empty")
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(catalog.CatalogError, match=r"no \.safetensors"):
        entry_of(model_copy)
    with pytest.raises(ValueError, match="model id"):
        catalog.ModelSource(id="../etc", source="x")
    with pytest.raises(ValueError, match="credentials"):
        catalog.ModelSource(id="m", source="s3://b/m", storage_options={"secret": "s"})


def test_verify_names_a_missing_resized_or_corrupt_file(model_copy: Path) -> None:
    entry = entry_of(model_copy)
    catalog.verify(entry)
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(catalog.CatalogError, match=r"model\.safetensors is corrupt"):
        catalog.verify(entry)
    weights.write_bytes(bytes(data[:-1]))
    with pytest.raises(catalog.CatalogError, match="bytes, the catalog recorded"):
        catalog.verify(entry)
    weights.unlink()
    with pytest.raises(catalog.CatalogError, match="missing"):
        catalog.verify(entry)


def test_staging_copies_verifies_and_reuses(model_copy: Path, tmp_path: Path) -> None:
    entry = entry_of(model_copy)
    seen: list[int] = []
    staged = loader.stage(entry, tmp_path / "cache", progress=lambda done, total: seen.append(done))
    for file in entry.files:
        assert (staged / file.path).read_bytes() == (model_copy / file.path).read_bytes()
    assert seen[-1] == entry.size_bytes
    (model_copy / "model.safetensors").unlink()  # the source is gone: the cache answers
    assert loader.stage(entry, tmp_path / "cache") == staged


def test_an_interrupted_download_resumes_from_its_part_file(model_copy: Path, tmp_path: Path) -> None:
    entry = entry_of(model_copy)
    target = loader.staged_dir(entry, tmp_path / "cache")
    target.mkdir(parents=True)
    source = (model_copy / "model.safetensors").read_bytes()
    (target / "model.safetensors.part").write_bytes(source[: len(source) // 2])
    fetched: list[int] = []
    loader.stage(entry, tmp_path / "cache", progress=lambda done, total: fetched.append(done))
    assert (target / "model.safetensors").read_bytes() == source
    assert not (target / "model.safetensors.part").exists()


def test_a_corrupt_source_fails_staging_and_leaves_nothing_behind(model_copy: Path, tmp_path: Path) -> None:
    entry = entry_of(model_copy)
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(catalog.CatalogError, match=r"model\.safetensors is corrupt"):
        loader.stage(entry, tmp_path / "cache")
    target = loader.staged_dir(entry, tmp_path / "cache")
    assert not (target / "model.safetensors").exists() and not (target / loader.COMPLETE_MARKER).exists()
