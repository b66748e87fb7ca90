"""Bad input from Python: clear exceptions carrying the library's message."""

import pytest

import transformer
from conftest import shared_path


def test_missing_paths_raise_file_not_found(tmp_path):
    missing = tmp_path / "no-such-model"
    for load in (transformer.Generator, transformer.Translator, transformer.Encoder):
        with pytest.raises(FileNotFoundError, match="no-such-model"):
            load(missing)
    with pytest.raises(OSError, match="does not exist"):
        transformer.train_lm(tmp_path / "none.txt", tmp_path / "out")


def test_bad_files_and_arguments_raise_value_error(tmp_path):
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello")
    with pytest.raises(ValueError, match="notes.txt"):
        transformer.Generator(not_a_model)
    with pytest.raises(ValueError, match="notes.txt"):
        transformer.Translator(not_a_model)
    gguf = shared_path("reference", "families", "llama", "llama.f16.gguf")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(gguf.read_bytes()[:4096])
    with pytest.raises(ValueError, match="cut.gguf"):
        transformer.Generator(truncated)
    g = transformer.Generator(gguf)
    with pytest.raises(ValueError, match="temperature"):
        g.generate("x", temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        g.generate("x", top_p=0.0)
    with pytest.raises(ValueError, match="precision"):
        transformer.Generator(gguf, precision="f8")
    with pytest.raises(ValueError, match="outside|vocabulary|id"):
        g.logits([10**6])
    with pytest.raises(ValueError, match="activation"):
        transformer.train_lm(not_a_model, tmp_path / "o", activation="tanh")


def test_empty_model_directory_names_the_missing_file(tmp_path):
    with pytest.raises(OSError, match="config.json"):
        transformer.Translator(tmp_path)
