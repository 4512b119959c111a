"""The embedded demo model: a plain HF folder that transformers loads, rebuilt when damaged."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import clean_env
from transformers import AutoModelForCausalLM, AutoTokenizer

from tpu_plugins import demo_model


def test_cli_prints_the_folder_as_last_line(demo_model_path):
    cli = str(Path(sys.executable).with_name("tpu-plugins"))
    proc = subprocess.run([cli, "demo-model"], capture_output=True, text=True, timeout=600, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip().splitlines()[-1]) == demo_model_path
    for name in demo_model.REQUIRED_FILES:
        assert (demo_model_path / name).is_file()


def test_plain_transformers_generates_the_same_as_from_the_gguf(demo_model_path):
    gguf_path, _ = demo_model.gguf_source()
    prompt = [{"role": "user", "content": "What is the capital of France?"}]

    def greedy(model, tokenizer):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
        return out[0, ids["input_ids"].shape[1]:].tolist()

    tok = AutoTokenizer.from_pretrained(demo_model_path)
    ours = greedy(AutoModelForCausalLM.from_pretrained(demo_model_path), tok)
    reference = greedy(
        AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32),
        AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name),
    )
    assert ours == reference
    assert "Paris" in tok.decode(ours)


@pytest.fixture
def cache_copy(demo_model_path, tmp_path):
    target = demo_model.model_dir(tmp_path)
    shutil.copytree(demo_model_path, target)
    return tmp_path, target


def test_intact_copy_has_no_problems(cache_copy):
    _, folder = cache_copy
    assert demo_model.problems(folder) == []


def test_corrupt_and_partial_caches_are_detected(cache_copy):
    _, folder = cache_copy
    with (folder / "model.safetensors").open("r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert demo_model.problems(folder) == ["model.safetensors content does not match its checksum"]
    (folder / "tokenizer.json").write_text("{}")
    assert any("tokenizer.json has" in p for p in demo_model.problems(folder))
    (folder / demo_model.MANIFEST).unlink()
    assert demo_model.problems(folder)[0].startswith("no tpu-plugins-manifest.json")


def test_damaged_cache_is_rebuilt(cache_copy):
    cache_dir, folder = cache_copy
    with (folder / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    rebuilt = demo_model.prepare(cache_dir=cache_dir)
    assert rebuilt == folder
    assert demo_model.problems(folder) == []
