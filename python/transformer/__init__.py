"""The Transformer of "Attention Is All You Need", written in Rust: translation, text
generation and chat (our language models, Hugging Face directories, GGUF files), sentence
embeddings and training, with the GIL released while the model works.

    >>> import transformer
    >>> g = transformer.Generator("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> g.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=16)
    'The capital of France is Paris.'

Errors are raised with the library's message: ``OSError`` (``FileNotFoundError``) for files
that are missing or unreadable, ``ValueError`` for anything else refused.
"""

from ._transformer import (
    Encoder,
    Generator,
    TokenStream,
    Translator,
    __version__,
    train,
    train_lm,
)

__all__ = [
    "Encoder",
    "Generator",
    "TokenStream",
    "Translator",
    "__version__",
    "train",
    "train_lm",
]
