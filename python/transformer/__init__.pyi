"""Type stubs of the `transformer` package (the native module `transformer._transformer`)."""

from os import PathLike
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Path = Union[str, PathLike[str]]

class Translator:
    """A translation model directory written by `transformer train` (or `demo --out`)."""

    def __init__(
        self, path: _Path, precision: str = "f32", threads: Optional[int] = None
    ) -> None:
        """Loads `path`; `precision` "f32", "bf16" or "int8"; `threads` workers (None: all cores)."""
    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 1,
        nbest: int = 1,
        alpha: float = 0.6,
        max_extra: int = 50,
        batch_size: int = 32,
        beam_stop: str = "exact",
    ) -> Union[list[str], list[list[tuple[float, str]]]]:
        """Translations (greedy with beam=1); with nbest > 1, per sentence `(score, text)` best first."""
    def score(
        self, sources: Sequence[str], targets: Sequence[str], batch_size: int = 32
    ) -> list[float]:
        """`log p(target | source)` of each pair, summed over the target tokens and the end."""

class TokenStream(Iterator[str]):
    """Pieces of text as they are sampled; iterating waits with the GIL released."""

    def __iter__(self) -> "TokenStream": ...
    def __next__(self) -> str: ...

class Generator:
    """A decoder-only language model: a `train-lm` directory, a Hugging Face directory or a GGUF file."""

    vocab_size: int
    max_len: int
    has_chat_template: bool

    def __init__(
        self,
        path: _Path,
        precision: str = "f32",
        threads: Optional[int] = None,
        ctx_size: Optional[int] = None,
    ) -> None:
        """Loads `path`; `precision` "f32", "bf16", "int8" or (GGUF) "ggml"; `ctx_size` the
        longest sequence (default: the model's context; checked against the memory available)."""
    def generate(
        self,
        prompt: str,
        max_tokens: int = 200,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 1,
        stop: Optional[Sequence[str]] = None,
    ) -> str:
        """The continuation of `prompt` (temperature 0: greedy), cut before the first stop string."""
    def stream(
        self,
        prompt: str,
        max_tokens: int = 200,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 1,
        stop: Optional[Sequence[str]] = None,
    ) -> TokenStream:
        """`generate`, as an iterator of pieces while they are sampled."""
    def generate_tokens(
        self,
        ids: Sequence[int],
        max_tokens: int = 200,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 1,
        until: Optional[Sequence[int]] = None,
    ) -> list[int]:
        """The ids sampled after `ids`, ending after an end-of-sequence id or one of `until`."""
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 1,
        stop: Optional[Sequence[str]] = None,
    ) -> str:
        """The assistant's reply to `messages` through the model's chat template."""
    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> str:
        """The prompt text `chat` feeds, rendered as transformers renders it."""
    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """The logits at every position of `ids`, shape `[len(ids), vocab_size]`."""
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """The ids of `text` (with BOS / <|endoftext|> first as a prompt is fed, unless add_special=False)."""
    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of `ids`."""

class Encoder:
    """A pretrained BERT-style sentence encoder (e.g. all-MiniLM-L6-v2)."""

    dim: int

    def __init__(
        self,
        path: _Path,
        precision: str = "f32",
        threads: Optional[int] = None,
        max_len: Optional[int] = None,
    ) -> None:
        """Loads a Hugging Face BERT directory."""
    def embed(
        self, sentences: Sequence[str], batch_size: int = 32
    ) -> npt.NDArray[np.float32]:
        """L2-normalised sentence embeddings, shape `[len(sentences), dim]`."""

_Progress = Optional[Callable[[dict[str, Any]], Any]]

def train_lm(
    text: _Path,
    out: _Path,
    *,
    valid_fraction: float = 0.05,
    resume: Optional[_Path] = None,
    vocab_size: int = 4096,
    context: int = 128,
    batch: int = 16,
    d_model: int = 256,
    n_heads: int = 4,
    d_ff: int = 1024,
    layers: int = 4,
    dropout: float = 0.1,
    pre_ln: bool = False,
    activation: str = "gelu-tanh",
    positions: str = "sinusoidal",
    normalization: str = "layer-norm",
    n_kv_heads: Optional[int] = None,
    no_bias: bool = False,
    rope_base: float = 10000.0,
    untied: bool = False,
    qkv_bias: bool = False,
    qk_norm: bool = False,
    sliding_window: Optional[int] = None,
    max_steps: int = 5000,
    time_limit: Optional[float] = None,
    precision: str = "f32",
    bf16_kernel: str = "gemm",
    lr: float = 5e-4,
    warmup: int = 200,
    clip_norm: float = 1.0,
    label_smoothing: float = 0.0,
    seed: int = 1,
    threads: int = 0,
    eval_every: int = 500,
    log_every: int = 100,
    save_every: int = 0,
    keep_last: int = 5,
    autosave: float = 600.0,
    overwrite: bool = False,
    progress: _Progress = None,
) -> dict[str, Any]:
    """Trains a decoder-only language model as `transformer train-lm`; returns the run's summary."""

def train(
    out: _Path,
    train_file: Optional[_Path] = None,
    *,
    src_file: Optional[_Path] = None,
    tgt_file: Optional[_Path] = None,
    valid: Optional[_Path] = None,
    valid_src: Optional[_Path] = None,
    valid_tgt: Optional[_Path] = None,
    resume: Optional[_Path] = None,
    preset: str = "tiny",
    config: Optional[_Path] = None,
    max_steps: int = 1000,
    time_limit: Optional[float] = None,
    seed: int = 1,
    threads: int = 0,
    tokens_per_batch: int = 4000,
    accumulate: int = 1,
    clip_norm: Optional[float] = None,
    warmup: int = 4000,
    lr_factor: float = 1.0,
    cooldown: Optional[int] = None,
    label_smoothing: float = 0.1,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
    activation_dropout: Optional[float] = None,
    word_dropout: float = 0.0,
    precision: str = "f32",
    bf16_kernel: str = "gemm",
    pre_ln: bool = False,
    vocab_level: str = "char",
    vocab_size: int = 8000,
    max_len: Optional[int] = None,
    save_every: int = 0,
    keep_last: int = 5,
    autosave: float = 600.0,
    overwrite: bool = False,
    log_every: int = 100,
    valid_every: int = 0,
    valid_bleu_lines: int = 0,
    progress: _Progress = None,
) -> dict[str, Any]:
    """Trains a translation model as `transformer train`; returns the run's summary."""
